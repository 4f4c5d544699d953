//! `docs/configuration.md` carries the `run` flags table generated from the clap definitions
//! (`tests/docs_gen`). This test fails when the file is out of date; with
//! `CAPC_HEALTH_UPDATE_DOCS=1` (what `make docs` sets) it rewrites the block instead. The same for
//! `hack/release/run-flags.json`, the flags the chart's `config` values are generated from.

use std::path::PathBuf;

mod docs_gen;

use docs_gen::{replace_generated, run_flags_json, run_flags_markdown};

#[test]
fn configuration_reference_matches_the_flags() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let doc = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} unreadable: {e}", path.display()));
    let expected = replace_generated(&doc, &run_flags_markdown())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if expected == doc {
        return;
    }
    if std::env::var("CAPC_HEALTH_UPDATE_DOCS").as_deref() == Ok("1") {
        std::fs::write(&path, &expected)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("rewrote the generated flags table in {}", path.display());
        return;
    }
    let first_difference = doc
        .lines()
        .zip(expected.lines())
        .position(|(a, b)| a != b)
        .map(|i| i + 1)
        .unwrap_or_else(|| doc.lines().count().min(expected.lines().count()) + 1);
    panic!(
        "{} is out of date with the flags of `capc-health-shim run` (first difference at line \
         {first_difference}).\nRun `make docs` to regenerate the table between the markers, then \
         commit the file.\n--- expected block ---\n{}",
        path.display(),
        run_flags_markdown()
    );
}

/// `hack/release/run-flags.json`: the `run` flags from clap, which hack/release turns into the
/// chart's `config` values (one per flag, rendered as its `CAPC_HEALTH_*` variable when set).
#[test]
fn the_charts_flag_list_matches_the_flags() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("hack/release/run-flags.json");
    let expected = run_flags_json();
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current == expected {
        return;
    }
    if std::env::var("CAPC_HEALTH_UPDATE_DOCS").as_deref() == Ok("1") {
        std::fs::write(&path, &expected)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("rewrote {}", path.display());
        return;
    }
    panic!(
        "{} is out of date with the flags of `capc-health-shim run`: run `make docs`, then \
         `make release-manifests` (the chart's config values follow it), and commit both",
        path.display()
    );
}
