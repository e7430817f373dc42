//! hyperlens model.
