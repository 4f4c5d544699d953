//! Binaries of other workspace members. Cargo names only a package's own binaries in
//! `CARGO_BIN_EXE_*`; `cargo test --workspace` (what `make test` runs) builds every member's
//! binaries into the same target directory as the test executables.

use std::path::PathBuf;

/// `target/<profile>/<name>`, found from the running test executable
/// (`target/<profile>/deps/<test>-<hash>`); panics with the build command when it is missing.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executables live in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build -p {name}` (`make test` does)",
        path.display()
    );
    path
}
