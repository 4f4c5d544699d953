//! The generated part of `docs/configuration.md`: the flags of `capc-health-shim run` (name,
//! environment variable, default, help) as a Markdown table, rendered from the clap
//! definitions themselves. `tests/docs_sync.rs` fails when the file differs from what this
//! renders; `make docs` rewrites the block. (Test tooling: not compiled into the product.)

use clap::{ArgAction, CommandFactory, Parser};

use capc_health_shim::controller::RunArgs;

/// The line that opens the generated block.
pub const BEGIN_MARKER: &str = "<!-- BEGIN GENERATED FLAGS (make docs; do not edit by hand) -->";
/// The line that closes it.
pub const END_MARKER: &str = "<!-- END GENERATED FLAGS -->";

#[derive(Parser)]
#[command(name = "capc-health-shim run")]
struct RunFlags {
    #[command(flatten)]
    run: RunArgs,
}

fn cell(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// `s` ending in a full stop (clap drops the doc comment's final period).
fn sentence(s: &str) -> String {
    let s = s.trim();
    if s.is_empty() || s.ends_with('.') {
        s.to_string()
    } else {
        format!("{s}.")
    }
}

/// The `run` flags as a Markdown table, one row per flag, in definition order.
pub fn run_flags_markdown() -> String {
    let cmd = RunFlags::command();
    let mut out = String::from(
        "| Flag | Environment variable | Default | Description |\n|---|---|---|---|\n",
    );
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(arg.get_action(), ArgAction::Help | ArgAction::Version) {
            continue;
        }
        let takes_value = !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        let flag = if takes_value {
            let value = arg
                .get_value_names()
                .and_then(|v| v.first())
                .map(|v| v.to_string())
                .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
            format!("`--{long} <{value}>`")
        } else {
            format!("`--{long}`")
        };
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_else(|| "—".into());
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = match (takes_value, defaults.is_empty()) {
            (false, _) => "off".to_string(),
            (true, true) => "—".to_string(),
            (true, false) => format!("`{}`", defaults.join(",")),
        };
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|_| takes_value)
            .map(|v| match v.get_help() {
                Some(h) => format!(
                    "`{}` — {}",
                    v.get_name(),
                    h.to_string().trim_end_matches('.')
                ),
                None => format!("`{}`", v.get_name()),
            })
            .collect();
        let mut help = sentence(&help);
        if !values.is_empty() {
            help = format!("{help} One of: {}.", values.join("; "));
        }
        if matches!(arg.get_action(), ArgAction::Append) {
            if let Some(d) = arg.get_value_delimiter() {
                help = format!("{help} In the environment variable: separated by `{d}`.");
            }
        }
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            flag,
            env,
            cell(&default),
            cell(&help)
        ));
    }
    out
}

/// The `run` flags as JSON, in definition order, for hack/release's chart generator (the chart's
/// `config` values, one per flag; `hack/release/run-flags.json`, kept current by
/// `tests/docs_sync.rs` and `make docs`): name, environment variable, whether it takes a value
/// and may repeat (with the separator its variable uses), its default, possible values and help.
pub fn run_flags_json() -> String {
    let cmd = RunFlags::command();
    let mut flags = Vec::new();
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(arg.get_action(), ArgAction::Help | ArgAction::Version) {
            continue;
        }
        let takes_value = !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        let repeatable = matches!(arg.get_action(), ArgAction::Append);
        let default: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let possible: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|_| takes_value)
            .map(|v| v.get_name().to_string())
            .collect();
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| cell(&h.to_string()))
            .unwrap_or_default();
        flags.push(serde_json::json!({
            "flag": long,
            "env": arg.get_env().map(|e| e.to_string_lossy().into_owned()),
            "takesValue": takes_value,
            "repeatable": repeatable,
            "delimiter": arg.get_value_delimiter().map(|d| d.to_string()),
            "default": if takes_value { Some(default.join(",")) } else { None },
            "possibleValues": possible,
            "help": sentence(&help),
        }));
    }
    serde_json::to_string_pretty(&serde_json::json!({
        "generatedBy": "tests/docs_gen (make docs) from the clap definitions of `capc-health-shim run`; do not edit",
        "flags": flags,
    }))
    .unwrap()
        + "\n"
}

/// `doc` with the text between the markers replaced by `block`; an error when the markers are
/// missing or out of order.
pub fn replace_generated(doc: &str, block: &str) -> Result<String, String> {
    let begin = doc
        .find(BEGIN_MARKER)
        .ok_or_else(|| format!("marker {BEGIN_MARKER:?} not found"))?;
    let after_begin = begin + BEGIN_MARKER.len();
    let end = doc[after_begin..]
        .find(END_MARKER)
        .map(|i| after_begin + i)
        .ok_or_else(|| format!("marker {END_MARKER:?} not found after the begin marker"))?;
    Ok(format!("{}\n{}{}", &doc[..after_begin], block, &doc[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_run_flag_has_a_row_with_its_env_and_default() {
        let md = run_flags_markdown();
        assert!(
            md.contains(
                "| `--poll-interval <POLL_INTERVAL>` | `CAPC_HEALTH_POLL_INTERVAL` | `30s` |"
            ),
            "{md}"
        );
        assert!(
            md.contains("`--no-leader-election` | `CAPC_HEALTH_NO_LEADER_ELECTION` | off |"),
            "{md}"
        );
        assert!(
            md.contains("`--stopped-grace <DURATION>` | `CAPC_HEALTH_STOPPED_GRACE` | `60s` |"),
            "{md}"
        );
        assert!(
            md.contains("One of: `auto` — Detect from the served APIs"),
            "{md}"
        );
        assert!(md.contains("(jittered by ±10%). |"), "{md}");
        assert!(!md.contains("--help"));
    }

    /// One rule for every flag of `run`: its environment variable is `CAPC_HEALTH_` and the
    /// flag's name in capitals (issue 43: the graces, guard and probe flags once had none).
    #[test]
    fn every_run_flag_has_the_environment_variable_named_after_it() {
        let cmd = RunFlags::command();
        let mut checked = 0;
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" {
                continue;
            }
            let want = format!("CAPC_HEALTH_{}", long.to_uppercase().replace('-', "_"));
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            // A repeatable flag may name its variable in the plural (`--namespace`,
            // CAPC_HEALTH_NAMESPACES: a list separated by `,`).
            let plural = matches!(arg.get_action(), ArgAction::Append)
                && env.as_deref() == Some(format!("{want}S").as_str());
            assert!(
                plural || env.as_deref() == Some(want.as_str()),
                "--{long}: {env:?}, want {want}"
            );
            checked += 1;
        }
        assert!(checked > 40, "only {checked} flags of run seen");
    }

    #[test]
    fn the_block_between_the_markers_is_replaced() {
        let doc = format!("intro\n{BEGIN_MARKER}\nold\n{END_MARKER}\noutro\n");
        assert_eq!(
            replace_generated(&doc, "new\n").unwrap(),
            format!("intro\n{BEGIN_MARKER}\nnew\n{END_MARKER}\noutro\n")
        );
        assert!(replace_generated("no markers", "x").is_err());
    }
}
