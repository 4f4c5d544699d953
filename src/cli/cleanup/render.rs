//! `cleanup`'s listing for people: what is there, what `--yes` does with each, the totals;
//! and what `--yes` did (pure).

use super::decide::Owned;
use capi_model::condition::FIELD_MANAGER;

fn owned_cell(owned: &[Owned]) -> String {
    if owned.is_empty() {
        return "-".into();
    }
    owned
        .iter()
        .map(|o| {
            let mut cell = o.key.clone();
            if !o.shared_with.is_empty() {
                let who = o.shared_with.join(",");
                cell.push_str(&format!(" (also owned by {who}: stays as {who} set it)"));
            }
            if !o.fields_also_set_by.is_empty() {
                let who = o.fields_also_set_by.join(",");
                cell.push_str(&format!(" (fields also set by {who})"));
            }
            cell
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The listing for people: what is there, what `--yes` does with each, the totals.
pub fn render(s: &super::Survey, condition_type: &str, own_namespace: &str) -> String {
    let mut out = format!(
        "What capc-health-shim left behind (its namespace {own_namespace}, condition type {condition_type}, field manager {FIELD_MANAGER}):\n"
    );
    out.push_str("\nOBJECTS (deleted with --yes)\n");
    if s.objects.is_empty() {
        out.push_str("  none\n");
    }
    for o in &s.objects {
        let held = o
            .held_by
            .as_deref()
            .map(|h| format!("  (held by {h}: the shim still runs)"))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {:<10} {}/{}{held}\n",
            o.kind, o.namespace, o.name
        ));
    }
    out.push_str("\nMACHINES (the shim's fields removed with --yes; CAPI's stay)\n");
    if s.machines.is_empty() {
        out.push_str("  none\n");
    } else {
        let rows: Vec<[String; 4]> = s
            .machines
            .iter()
            .map(|m| {
                let mut other = m.other_fields.clone();
                other.extend(m.kept.iter().map(|k| format!("{k} (kept)")));
                [
                    format!("{}/{}", m.namespace, m.name),
                    owned_cell(&m.conditions),
                    owned_cell(&m.annotations),
                    if other.is_empty() {
                        "-".into()
                    } else {
                        other.join(", ")
                    },
                ]
            })
            .collect();
        let head = ["MACHINE", "CONDITIONS", "ANNOTATIONS", "OTHER FIELDS"].map(String::from);
        let width = |i: usize| {
            std::iter::once(&head)
                .chain(&rows)
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths = [width(0), width(1), width(2)];
        for r in std::iter::once(&head).chain(&rows) {
            out.push_str(&format!(
                "  {:<w0$}  {:<w1$}  {:<w2$}  {}\n",
                r[0],
                r[1],
                r[2],
                r[3],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2]
            ));
        }
    }
    out.push_str(
        "\nMACHINEHEALTHCHECKS (the operator's objects: the patch is printed; applied only with --yes --remove-mhc-entries)\n",
    );
    if s.mhcs.is_empty() {
        out.push_str("  none\n");
    }
    for h in &s.mhcs {
        out.push_str(&format!(
            "  {}/{}: {} entr{} naming {condition_type} at {}\n    {}\n",
            h.namespace,
            h.name,
            h.entries.len(),
            if h.entries.len() == 1 { "y" } else { "ies" },
            h.pointer,
            h.kubectl()
        ));
    }
    if !s.notes.is_empty() {
        out.push_str("\nNOTES\n");
        for n in &s.notes {
            out.push_str(&format!("  {n}\n"));
        }
    }
    let conditions: usize = s.machines.iter().map(|m| m.conditions.len()).sum();
    let annotations: usize = s.machines.iter().map(|m| m.annotations.len()).sum();
    let other: usize = s.machines.iter().map(|m| m.other_fields.len()).sum();
    let mhc_entries: usize = s.mhcs.iter().map(|h| h.entries.len()).sum();
    out.push_str(&format!(
        "\nTOTAL: {} object(s), {conditions} condition entr{} and {annotations} annotation(s) (+{other} other field(s)) on {} Machine(s), {mhc_entries} MachineHealthCheck entr{} in {} MachineHealthCheck(s)\n",
        s.objects.len(),
        if conditions == 1 { "y" } else { "ies" },
        s.machines.len(),
        if mhc_entries == 1 { "y" } else { "ies" },
        s.mhcs.len()
    ));
    if !s.complete {
        out.push_str("INCOMPLETE: some of it could not be looked at (see NOTES)\n");
    }
    out
}

/// What `--yes` did, for people.
pub fn render_removal(removed: &[String], failed: &[String]) -> String {
    let mut out = format!("\nREMOVED ({})\n", removed.len());
    for r in removed {
        out.push_str(&format!("  {r}\n"));
    }
    if !failed.is_empty() {
        out.push_str(&format!("FAILED ({})\n", failed.len()));
        for f in failed {
            out.push_str(&format!("  {f}\n"));
        }
    }
    out
}
