//! The fuzz targets' shared code: [`props`] holds the properties of the bad-input surfaces.
//! The same file is compiled into the product's proptests (`tests/bad_input_props.rs`), so
//! fuzzing and proptest check the same assertions against the same crates.

pub mod props;
