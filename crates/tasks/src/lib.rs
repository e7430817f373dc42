//! hyperlens tasks.
