//! Fuzz target `condition_upsert`: the properties of [`fuzz_props::props::condition_upsert`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::props::condition_upsert(data));
