//! The fault matrix's rows (target/fault-matrix/<test>.json, read by `make bench`'s report):
//! each test that plays a fault keeps one row and it is written when the test ends, passed or
//! not, so a failing row is reported as failed rather than missing.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// target/fault-matrix, with its logs/ folder (the shims' logs of each row).
pub fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/fault-matrix");
    std::fs::create_dir_all(d.join("logs")).expect("target/fault-matrix");
    d
}

/// Seconds with one decimal, as the rows report them.
pub fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

/// One row: the fault, what is expected, what the test saw and measured along the way.
pub struct MatrixRow {
    pub test: &'static str,
    fault: &'static str,
    expected: String,
    observed: Vec<String>,
    measured: serde_json::Map<String, Value>,
    started: Instant,
}

impl MatrixRow {
    pub fn new(test: &'static str, fault: &'static str, expected: &str) -> Self {
        Self {
            test,
            fault,
            expected: expected.to_string(),
            observed: Vec::new(),
            measured: serde_json::Map::new(),
            started: Instant::now(),
        }
    }

    /// Notes what the test saw (also on stderr, with the test's name, as it happens).
    pub fn saw(&mut self, what: impl Into<String>) {
        let what = what.into();
        eprintln!("[{}] {what}", self.test);
        self.observed.push(what);
    }

    pub fn measure(&mut self, key: &str, v: impl Into<Value>) {
        self.measured.insert(key.to_string(), v.into());
    }
}

impl Drop for MatrixRow {
    fn drop(&mut self) {
        let row = json!({
            "test": self.test,
            "fault": self.fault,
            "expected": self.expected,
            "observed": self.observed.join("; "),
            "measured": self.measured,
            "result": if std::thread::panicking() { "fail" } else { "pass" },
            "run_seconds": secs(self.started.elapsed()),
        });
        let _ = std::fs::write(
            out_dir().join(format!("{}.json", self.test)),
            serde_json::to_string_pretty(&row).unwrap_or_default() + "\n",
        );
    }
}
