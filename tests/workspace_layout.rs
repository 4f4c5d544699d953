//! The house rules of the workspace, checked: the product's normal dependency tree holds
//! neither the simulator nor test-only crates, every crate's `lib.rs` opens with what the crate
//! is for, and no product source file grows past the size one can read at once.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The target triple this test was built for, as `rustc -vV` names the host.
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc)
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .trim()
        .to_string()
}

/// The resolved graph for this host only: offline, so it must need nothing a build of the
/// workspace did not already download. Without `--filter-platform`, cargo wants every
/// platform's crates (Windows console crates and the like), which a fresh machine never fetched.
fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let host = host_triple();
    let offline_for_this_host = ["--offline", "--filter-platform", host.as_str()];
    let out = Command::new(cargo)
        .current_dir(root())
        .args(["metadata", "--format-version", "1", "--locked"])
        .args(offline_for_this_host)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("metadata JSON")
}

/// Package names reachable from `root_name` through normal (not dev, not build) dependencies.
fn normal_closure(meta: &Value, root_name: &str) -> BTreeSet<String> {
    let name_of: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve graph")
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let start = name_of
        .iter()
        .find(|(_, n)| **n == root_name)
        .map(|(id, _)| *id)
        .expect("the root package");
    let mut seen = BTreeSet::new();
    let mut todo = vec![start];
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            if normal {
                todo.push(dep["pkg"].as_str().unwrap());
            }
        }
    }
    seen.iter().map(|id| name_of[id].to_string()).collect()
}

#[test]
fn the_product_depends_on_its_crates_but_not_on_the_simulator_or_test_support() {
    let meta = metadata();
    let product = normal_closure(&meta, "capc-health-shim");
    for needed in ["cloudstack-api", "verdict", "kube", "reqwest"] {
        assert!(product.contains(needed), "the product lost {needed}");
    }
    for dev_only in [
        "cloudstack-sim",
        "test-support",
        "anyhow",
        "criterion",
        "proptest",
    ] {
        assert!(
            !product.contains(dev_only),
            "{dev_only} is in the product's dependency tree"
        );
    }
    // The pure crates stay pure: no async runtime, HTTP or Kubernetes stack unless asked for
    // (cloudstack-api's HTTP client is an optional feature). The resolve graph unifies the
    // features of the whole workspace, so this reads the declared dependencies.
    for pure in ["verdict", "cloudstack-api"] {
        let declared = required_dependencies(&meta, pure);
        for heavy in [
            "tokio",
            "reqwest",
            "kube",
            "k8s-openapi",
            "axum",
            "hyper-util",
        ] {
            assert!(
                !declared.contains(heavy),
                "{pure} requires {heavy} (directly or through a workspace crate)"
            );
        }
    }
}

/// Non-optional normal dependencies `name` declares, followed through workspace path crates.
fn required_dependencies(meta: &Value, name: &str) -> BTreeSet<String> {
    let packages = meta["packages"].as_array().expect("packages");
    let by_name = |n: &str| packages.iter().find(|p| p["name"] == n);
    let mut out = BTreeSet::new();
    let mut todo = vec![name.to_string()];
    while let Some(n) = todo.pop() {
        let Some(p) = by_name(&n) else { continue };
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let required = d["kind"].is_null() && d["optional"] == false;
            let dep = d["name"].as_str().unwrap().to_string();
            if required && out.insert(dep.clone()) && d["path"].is_string() {
                todo.push(dep);
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_crate_says_what_it_is_for_and_product_files_stay_readable() {
    let root = root();
    for lib in [
        "src/lib.rs",
        "crates/cloudstack-api/src/lib.rs",
        "crates/verdict/src/lib.rs",
        "crates/cloudstack-sim/src/lib.rs",
        "crates/test-support/src/lib.rs",
    ] {
        let text = std::fs::read_to_string(root.join(lib)).expect(lib);
        assert!(
            text.starts_with("//! "),
            "{lib} does not open with a //! line saying what the crate is for"
        );
    }
    // The product: its own sources and the two crates it ships. Unit-test files are tests.
    let mut files = Vec::new();
    for dir in ["src", "crates/cloudstack-api/src", "crates/verdict/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    let too_long: Vec<String> = files
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "tests.rs"))
        .filter_map(|p| {
            let text = std::fs::read_to_string(p).expect("source");
            // Count the code above the unit tests: that is what one reads to follow it.
            let code = text.split("\n#[cfg(test)]").next().unwrap_or_default();
            let lines = code.lines().count();
            (lines > 650).then(|| format!("{} ({lines} lines)", p.display()))
        })
        .collect();
    assert!(
        too_long.is_empty(),
        "product files past ~600 lines of code: {too_long:?}"
    );
}

/// `make lint`'s guard against selectors that select nothing (hack/check-test-patterns.py):
/// the Makefile as it is passes, and a copy with one renamed Go scenario and one renamed
/// `--skip` fails, naming both.
#[test]
fn a_makefile_selector_that_selects_no_test_fails_the_guard() {
    let script = root().join("hack/check-test-patterns.py");
    let run = |makefile: &Path| {
        Command::new("python3")
            .arg(&script)
            .arg(makefile)
            .output()
            .expect("run python3 hack/check-test-patterns.py")
    };
    let ok = run(&root().join("Makefile"));
    assert!(
        ok.status.success(),
        "the Makefile's selectors: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let text = std::fs::read_to_string(root().join("Makefile")).expect("Makefile");
    let renamed = text
        .replace("TestScenario8DeletionRaces", "TestScenario8DeletionRace2")
        .replace(
            "--skip the_leader_killed_mid_escalation",
            "--skip the_leader_shot_mid_escalation",
        );
    assert_ne!(
        renamed, text,
        "the Makefile no longer names what this test renames"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let copy = dir.path().join("Makefile");
    std::fs::write(&copy, renamed).expect("write the copy");
    let bad = run(&copy);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "a renamed test passed the guard");
    assert!(err.contains("'TestScenario8DeletionRace2'"), "{err}");
    assert!(
        err.contains("--skip the_leader_shot_mid_escalation"),
        "{err}"
    );
}
