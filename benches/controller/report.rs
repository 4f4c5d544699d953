//! Writes this bench's flat `{"name": value}` file (`target/bench/controller.json`,
//! `target/bench/soak.json`) and merges it into `target/bench/report.json` and one section of
//! `target/bench/report.md` (replacing that section if an earlier run wrote it), so `make bench`
//! (cloudstack → scale → controller) ends with one complete report.

use std::collections::BTreeMap;
use std::path::Path;

pub const DIR: &str = "target/bench";

pub fn write_and_merge(
    file: &str,
    values: &BTreeMap<String, f64>,
    heading: &str,
    section: &str,
) -> std::io::Result<()> {
    let dir = Path::new(DIR);
    std::fs::create_dir_all(dir)?;
    let json =
        |v: &BTreeMap<String, f64>| serde_json::to_string_pretty(v).map_err(std::io::Error::other);
    std::fs::write(dir.join(file), json(values)?)?;

    let report = dir.join("report.json");
    let mut all: BTreeMap<String, f64> = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    all.extend(values.iter().map(|(k, v)| (k.clone(), *v)));
    std::fs::write(&report, json(&all)?)?;

    let md_path = dir.join("report.md");
    let md = std::fs::read_to_string(&md_path).unwrap_or_else(|_| {
        "# capc-health-shim: scale and speed (issue 7)\n\n\
         (`cargo bench --bench scale` has not written parts 1–3 and 5 yet.)\n\n"
            .to_string()
    });
    std::fs::write(&md_path, merge_section(&md, heading, section))
}

/// `md` with the `## ` section starting with `heading` replaced by `section` or, when it has
/// none, with `section` inserted before the first later-numbered section (or appended).
pub fn merge_section(md: &str, heading: &str, section: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut rest = md;
    // split into a preamble and "## " sections
    while let Some(pos) = rest.get(1..).and_then(|r| r.find("\n## ")).map(|p| p + 2) {
        parts.push(rest[..pos].to_string());
        rest = &rest[pos..];
    }
    parts.push(rest.to_string());
    let number = |s: &str| -> Option<u32> {
        s.strip_prefix("## ")?
            .split('.')
            .next()?
            .trim()
            .parse()
            .ok()
    };
    let mine = number(heading);
    let mut body = section.trim_end().to_string();
    body.push_str("\n\n");
    let mut out = Vec::new();
    let mut placed = false;
    for p in parts {
        if p.starts_with(heading) {
            if !placed {
                out.push(body.clone());
                placed = true;
            }
            continue;
        }
        if !placed && p.starts_with("## ") && number(&p) > mine && mine.is_some() {
            out.push(body.clone());
            placed = true;
        }
        out.push(p);
    }
    if !placed {
        if out.last().is_some_and(|l| !l.ends_with("\n\n")) {
            out.push("\n".into());
        }
        out.push(body);
    }
    out.concat()
}
