//! End-to-end tests of the `hyperlens` binary: one integration-test binary, one module per command.

mod circuits;
