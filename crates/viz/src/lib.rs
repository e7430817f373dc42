//! hyperlens viz.
