//! hyperlens train.
