//! What the client lists: the VM query and listing types, `listVirtualMachines` over id chunks
//! and `listVirtualMachinesUsageHistory`.

use std::collections::HashSet;

use tracing::warn;

use super::{CloudStackClient, IDS_PER_REQUEST};
use crate::error::CloudStackError;
use crate::model::{CsTime, UsageHistoryVm, VirtualMachine};
use crate::parse::ItemFailure;

/// Which VMs to list. All scoping fields are optional; `ids` are matched exactly
/// (an id CloudStack never knew fails the whole request with 431 — prefer client-side matching).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmListQuery {
    /// Project UUID, or `-1` for all projects the caller can see.
    pub project_id: Option<String>,
    pub zone_id: Option<String>,
    /// Account name (must be combined with `domain_id`).
    pub account: Option<String>,
    pub domain_id: Option<String>,
    pub ids: Vec<String>,
    /// Use `listVirtualMachinesMetrics` (CAPC's call) instead of `listVirtualMachines`.
    pub use_metrics_api: bool,
    /// Ask for traffic statistics (`details=nics,stats,…&accumulate=true`). Off, the listing is
    /// `details=nics`: CloudStack then sums no `vm_stats` rows, which for every listed VM can
    /// be up to retention × management servers rows (cloudstack-api.md §3.1b, "Cost").
    pub with_stats: bool,
}

/// The outcome of a paginated listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing<T> {
    /// Unique items (by id) in server order.
    pub items: Vec<T>,
    /// Items that could not be parsed; `index` is the row position across pages.
    pub failures: Vec<ItemFailure>,
    /// `true` only when every page was read, every item parsed and the rows add up to the
    /// server's `count`. Only a complete listing proves that a VM is absent.
    pub complete: bool,
    /// Pages read.
    pub pages: u32,
    /// HTTP requests made (including retries).
    pub calls: u32,
    /// The largest `count` the server reported (when it reported one).
    pub count: Option<u64>,
}

/// A `listVirtualMachines` result.
#[derive(Debug, Clone, PartialEq)]
pub struct VmListing {
    pub vms: Vec<VirtualMachine>,
    pub failures: Vec<ItemFailure>,
    /// See [`Listing::complete`]. An incomplete listing must not be used as evidence that a
    /// VM is gone.
    pub complete: bool,
    pub pages: u32,
    pub calls: u32,
}

impl CloudStackClient {
    /// Lists the VMs of a scope (`listall=true`, `details=nics`, with `stats` on request), all
    /// pages.
    ///
    /// Statistics are asked with `accumulate=true` (CloudStack 4.17+): the sum over every
    /// retained `vm_stats` row, whatever the global `vm.stats.increment.metrics` says — without
    /// it a server set to `false` answers with the latest row only, one interval's delta, which
    /// cannot be read as a counter. Older servers ignore the parameter (unknown parameters are
    /// not an error), which is why the counter alone never decides silence.
    pub async fn list_virtual_machines(
        &self,
        query: &VmListQuery,
    ) -> Result<VmListing, CloudStackError> {
        let command = if query.use_metrics_api {
            "listVirtualMachinesMetrics"
        } else {
            "listVirtualMachines"
        };
        let mut base: Vec<(&str, &str)> = vec![("listall", "true")];
        if query.with_stats {
            base.extend([
                ("details", "nics,stats,tmpl,servoff"),
                ("accumulate", "true"),
            ]);
        } else {
            base.push(("details", "nics,tmpl,servoff"));
        }
        if let Some(v) = &query.project_id {
            base.push(("projectid", v));
        }
        if let Some(v) = &query.zone_id {
            base.push(("zoneid", v));
        }
        if let Some(v) = &query.account {
            base.push(("account", v));
        }
        if let Some(v) = &query.domain_id {
            base.push(("domainid", v));
        }
        let chunks: Vec<String> = id_chunks(&query.ids, IDS_PER_REQUEST);
        let mut out = VmListing {
            vms: Vec::new(),
            failures: Vec::new(),
            complete: true,
            pages: 0,
            calls: 0,
        };
        let runs: Vec<Option<&str>> = if chunks.is_empty() {
            vec![None]
        } else {
            chunks.iter().map(|c| Some(c.as_str())).collect()
        };
        // Ids already taken, made only when a second run comes: the first run's items are
        // moved as they are (`list` de-duplicated them), no second Vec of 10 000 VMs.
        let mut seen: Option<HashSet<String>> = None;
        for ids in runs {
            let mut p = base.clone();
            if let Some(ids) = ids {
                p.push(("ids", ids));
            }
            let l: Listing<VirtualMachine> = self.list(command, "virtualmachine", &p).await?;
            out.complete &= l.complete;
            out.pages += l.pages;
            out.calls += l.calls;
            out.failures.extend(l.failures);
            if out.vms.is_empty() && seen.is_none() {
                out.vms = l.items;
                continue;
            }
            let seen = seen.get_or_insert_with(|| out.vms.iter().map(|vm| vm.id.clone()).collect());
            out.vms
                .extend(l.items.into_iter().filter(|vm| seen.insert(vm.id.clone())));
        }
        Ok(out)
    }

    /// Stats samples of the given VMs (`listVirtualMachinesUsageHistory`, CloudStack 4.17+).
    /// An older server or a role without the API gives [`CloudStackError::Unsupported`].
    /// `start_date` limits the samples; see [`usage_start_date`] for how it is written, and
    /// expect samples from before it (servers that read only the date). Unreadable items are
    /// skipped with a warning (usage history is only a liveness hint).
    pub async fn list_usage_history(
        &self,
        ids: &[String],
        start_date: Option<CsTime>,
    ) -> Result<Vec<UsageHistoryVm>, CloudStackError> {
        const COMMAND: &str = "listVirtualMachinesUsageHistory";
        let chunk = USAGE_IDS_PER_REQUEST.min(self.page_size() as usize).max(1);
        let start = start_date.map(usage_start_date);
        let mut out: Vec<UsageHistoryVm> = Vec::new();
        for ids in id_chunks(ids, chunk) {
            let mut p: Vec<(&str, &str)> = vec![("ids", &ids)];
            if let Some(s) = &start {
                p.push(("startdate", s));
            }
            let l: Listing<UsageHistoryVm> = self
                .list_pages(COMMAND, "virtualmachine", &p, false)
                .await
                .map_err(|e| {
                    if e.is_command_unavailable() {
                        CloudStackError::Unsupported {
                            command: COMMAND.to_string(),
                            detail: e.detail().cloned().unwrap_or_default(),
                        }
                    } else {
                        e
                    }
                })?;
            if !l.failures.is_empty() {
                warn!(
                    command = COMMAND,
                    failed = l.failures.len(),
                    "skipping usage-history items that could not be read"
                );
            }
            out.extend(l.items);
        }
        Ok(out)
    }
}

/// VMs per usage-history request. A server that reads only the date of `startdate` answers
/// with every retained row since (local) midnight — up to 720 minutes × management servers
/// rows per VM at CloudStack's default retention; ten VMs keep such an answer near 10 MiB.
pub const USAGE_IDS_PER_REQUEST: usize = 10;

/// `startdate` for the usage history, written so that every server version returns the
/// window or more, never less (docs/cloudstack-stats.md, "Dates"): the instant as ISO 8601 at
/// offset −12:00. Servers that parse zones (apache/cloudstack PR #7032) take the exact
/// instant; servers that read only `yyyy-MM-dd` in their own zone get a date that is never
/// later than the instant's date anywhere, so their midnight is before the instant. No `+`
/// in the value either, which a proxy could decode as a space.
pub fn usage_start_date(t: CsTime) -> String {
    let west = jiff::tz::TimeZone::fixed(jiff::tz::offset(-12));
    t.0.to_zoned(west)
        .strftime("%Y-%m-%dT%H:%M:%S-12:00")
        .to_string()
}

/// Lower-cased, de-duplicated ids joined with commas, `per` ids per chunk.
fn id_chunks(ids: &[String], per: usize) -> Vec<String> {
    let mut seen = HashSet::new();
    let clean: Vec<String> = ids
        .iter()
        .map(|i| i.trim().to_ascii_lowercase())
        .filter(|i| !i.is_empty() && seen.insert(i.clone()))
        .collect();
    clean.chunks(per.max(1)).map(|c| c.join(",")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_start_date_is_the_instant_at_minus_twelve_hours_and_never_a_later_date() {
        let t = CsTime("2026-12-02T14:05:09Z".parse().unwrap());
        assert_eq!(usage_start_date(t), "2026-12-02T02:05:09-12:00");
        // Just after midnight UTC the date written is the day before: a date-only server
        // anywhere (UTC−12 … UTC+14) starts at or before the instant.
        let t = CsTime("2026-12-02T00:10:00Z".parse().unwrap());
        assert_eq!(usage_start_date(t), "2026-12-01T12:10:00-12:00");
        assert!(!usage_start_date(t).contains('+'));
    }

    #[test]
    fn ids_are_chunked_lowercased_and_deduplicated() {
        let ids: Vec<String> = ["A", "b", "a", " c ", ""]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(id_chunks(&ids, 2), vec!["a,b".to_string(), "c".to_string()]);
        assert!(id_chunks(&[], 2).is_empty());
    }
}
