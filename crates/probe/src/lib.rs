//! hyperlens probe.
