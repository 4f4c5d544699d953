//! Build script: the commit the binary is built from, for `--version` and `/status`.
//!
//! `CAPC_HEALTH_SHIM_COMMIT` wins when set (a build without `.git`, such as the Dockerfile's, gets
//! it as a build argument); otherwise `git rev-parse HEAD` of this checkout; else `unknown`.
//! Cargo re-runs this script when the variable or the checked-out commit changes, so an
//! unchanged commit builds the same bytes (the image's digest depends on it).

use std::path::PathBuf;
use std::process::Command;

const VAR: &str = "CAPC_HEALTH_SHIM_COMMIT";

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env_dir())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn env_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default())
}

fn main() {
    println!("cargo:rerun-if-env-changed={VAR}");
    let commit = match std::env::var(VAR) {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_string(),
        _ => {
            // Watch what moves when the commit does: HEAD, the branch it names, packed refs.
            // (Only files that exist: Cargo re-runs every time for one that does not.)
            let branch = git(&["symbolic-ref", "-q", "HEAD"]);
            for path in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
                if let Some(p) = git(&["rev-parse", "--git-path", path]) {
                    let p = env_dir().join(p);
                    if p.exists() {
                        println!("cargo:rerun-if-changed={}", p.display());
                    }
                }
            }
            git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
        }
    };
    println!("cargo:rustc-env={VAR}={commit}");
}
