//! Every flag and environment variable the operator's documents name exists (issue 43): the
//! docs once promised environment fallbacks the graces never had, and named a CA flag one
//! subcommand did not take. The names are read from the binary's own `--help` of every
//! subcommand (clap prints each flag and its `[env: …]`), so a renamed flag fails here until
//! the documents follow.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_capc-health-shim");

/// Flags of other programs that the documents show in their commands, each with its program.
const OTHER_PROGRAMS_FLAGS: &[(&str, &str)] = &[
    ("--addon", "clusterctl"),
    ("--config", "clusterctl"),
    ("--target-namespace", "clusterctl"),
    ("--include-namespace", "clusterctl"),
    ("--event-ttl", "kube-apiserver"),
    ("--set", "helm"),
    ("--create-namespace", "helm"),
    ("--clusterrole", "kubectl"),
    ("--serviceaccount", "kubectl"),
    ("--raw", "kubectl"),
    ("--subresource", "kubectl"),
    ("--field-selector", "kubectl"),
    ("--type", "kubectl"),
    ("--dry-run", "kubectl, create-role.py"),
    ("--call", "create-role.py"),
    ("--probe", "create-role.py"),
    ("--listen", "cloudstack-sim"),
    ("--scenario", "cloudstack-sim"),
    ("--time-scale", "cloudstack-sim"),
    ("--port-file", "cloudstack-sim"),
    ("--tls-cert", "cloudstack-sim"),
    ("--tls-key", "cloudstack-sim"),
    ("--locked", "cargo"),
    ("--no-default-features", "cargo"),
    ("--bench", "cargo"),
    ("--provider-id", "kubelet"),
    ("--diagnostics-address", "CAPI's controllers"),
];

/// Variables the documents name that are not the shim's flags: the clusterctl variables of the
/// release files.
const OTHER_VARIABLES: &[&str] = &["CAPC_HEALTH_SHIM_IMAGE", "CAPC_HEALTH_SHIM_LOG"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn help(args: &[&str]) -> String {
    let out = Command::new(BINARY)
        .args(args)
        .arg("--help")
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{args:?} --help: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// `--name` tokens of `text` (a trailing `-` kept: `--tls-*` is a prefix).
fn flags_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i + 2 < b.len() {
        let starts = b[i] == b'-'
            && b[i + 1] == b'-'
            && b[i + 2].is_ascii_lowercase()
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'-'));
        if starts {
            let mut j = i + 2;
            while j < b.len()
                && (b[j].is_ascii_lowercase() || b[j].is_ascii_digit() || b[j] == b'-')
            {
                j += 1;
            }
            out.insert(text[i..j].to_string());
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// `CAPC_HEALTH_…` tokens of `text` (a bare `CAPC_HEALTH_` is the prefix itself).
fn variables_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("CAPC_HEALTH_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].trim_end_matches('_');
        if name.len() > "CAPC_HEALTH".len() {
            out.insert(name.to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// The shim's flags and variables, from `--help` of the binary and of every subcommand.
fn the_shims_names() -> (BTreeSet<String>, BTreeSet<String>) {
    let top = help(&[]);
    let subcommands: Vec<String> = top
        .split("Commands:")
        .nth(1)
        .expect("a Commands: section")
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|s| s != "help")
        .collect();
    assert!(
        subcommands.len() >= 5 && subcommands.iter().any(|s| s == "run"),
        "{subcommands:?}"
    );
    let mut texts = vec![top];
    texts.extend(subcommands.iter().map(|s| help(&[s.as_str()])));
    let mut flags = BTreeSet::from(["--version".to_string(), "--help".to_string()]);
    let mut variables = BTreeSet::new();
    for t in &texts {
        for line in t.lines() {
            let line = line.trim_start();
            // An option line: "-o, --output <OUTPUT>" or "--poll-interval <…>".
            if line.starts_with('-') {
                flags.extend(flags_in(line.split("  ").next().unwrap_or_default()));
            }
        }
        let mut rest = t.as_str();
        while let Some(i) = rest.find("[env: ") {
            let tail = &rest[i + 6..];
            let end = tail.find(['=', ']']).unwrap_or(tail.len());
            variables.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    (flags, variables)
}

fn documents() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("CONTRIBUTING.md"),
        root().join("deploy/README.md"),
    ];
    let mut stack = vec![root().join("docs"), root().join("deploy")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md" || x == "yaml") && !files.contains(&p)
            {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn every_flag_and_variable_the_documents_name_exists() {
    let (flags, variables) = the_shims_names();
    // The count the binary shows (positive control: a parse that found nothing passes nothing).
    assert!(flags.len() > 60, "{} flags: {flags:?}", flags.len());
    assert!(
        variables.contains("CAPC_HEALTH_STOPPED_GRACE"),
        "{variables:?}"
    );
    let other: BTreeSet<&str> = OTHER_PROGRAMS_FLAGS.iter().map(|(f, _)| *f).collect();
    let mut unknown = Vec::new();
    let mut seen = 0;
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("document");
        for f in flags_in(&text) {
            seen += 1;
            let known = flags.contains(&f)
                || other.contains(f.as_str())
                || (f.ends_with('-') && flags.iter().any(|k| k.starts_with(&f)));
            if !known {
                unknown.push(format!("{}: flag {f}", rel(&file)));
            }
        }
        for v in variables_in(&text) {
            seen += 1;
            if !variables.contains(&v) && !OTHER_VARIABLES.contains(&v.as_str()) {
                unknown.push(format!("{}: variable {v}", rel(&file)));
            }
        }
    }
    assert!(seen > 100, "only {seen} names found in the documents");
    assert!(
        unknown.is_empty(),
        "names the shim does not have (a renamed flag? another program's: add it to \
         OTHER_PROGRAMS_FLAGS with the program):\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_scanners_find_what_they_must() {
    assert_eq!(
        flags_in("run `--poll-interval 30s`, a-b --x, --tls-*, kubectl --type=json"),
        BTreeSet::from([
            "--poll-interval".into(),
            "--tls-".into(),
            "--type".into(),
            "--x".into()
        ])
    );
    assert_eq!(
        variables_in("`CAPC_HEALTH_POLL_INTERVAL`, CAPC_HEALTH_*, ${CAPC_HEALTH_SHIM_LOG:=warn}"),
        BTreeSet::from([
            "CAPC_HEALTH_POLL_INTERVAL".into(),
            "CAPC_HEALTH_SHIM_LOG".into()
        ])
    );
}
