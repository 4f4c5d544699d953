//! The slice of capc-health-shim the fuzz targets exercise: the very source files of the
//! library (`#[path]` into `../src`), laid out under the same module paths so that their
//! `crate::` and `super::` references resolve as in the library. See Cargo.toml for why this
//! is not a dependency on the library crate.
//!
//! [`props`] holds the properties; the same file is compiled into the library's proptests
//! (`tests/bad_input_props.rs`), so fuzzing and proptest check the same assertions.

// The slice leaves parts of the library's API unused; the library's files are linted where
// they live (`cargo clippy` in the main crate), `props` and the targets here.
#[allow(dead_code, unused_imports, clippy::all)]
pub mod cloudstack;
#[allow(dead_code, unused_imports, clippy::all)]
pub mod k8s;
#[allow(dead_code, unused_imports, clippy::all)]
pub mod sim;
#[allow(dead_code, unused_imports, clippy::all)]
#[path = "../../src/verdict/mod.rs"]
pub mod verdict;

pub mod props;
