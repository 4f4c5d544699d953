//! `updateConfiguration` for the VM stats settings that CloudStack reads at run time
//! (`ConfigKey`s declared dynamic in `StatsCollector@00114e8b`). Response shape as recorded
//! upstream (cloudstack-go `ConfigurationService.json`).

use serde_json::json;

use crate::api::{ApiError, Call, Reply};

const INCREMENT: &str = "vm.stats.increment.metrics";
const RETENTION: &str = "vm.stats.max.retention.time";

pub(super) fn update_configuration(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let name = call.require("name")?.to_string();
    let value = call.get("value").unwrap_or("").trim().to_string();
    let s = &mut call.world.settings;
    let description = match name.as_str() {
        INCREMENT => {
            // A Boolean ConfigKey: CloudStack validates "true"/"false".
            s.stats_increment_metrics = match value.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(ApiError::invalid_value(format!(
                        "Please enter either 'true' or 'false' for {name}"
                    )))
                }
            };
            "When set to 'true', VM metrics(NetworkReadKBs, NetworkWriteKBs, DiskWriteKBs, DiskReadKBs, DiskReadIOs and DiskWriteIOs) that are collected from the hypervisor are summed before being returned.On the other hand, when set to 'false', the VM metrics API will just display the latest metrics collected."
        }
        RETENTION => {
            let minutes: i64 = value.parse().map_err(|_| {
                ApiError::invalid_value(format!(
                    "Please enter a valid integer value for parameter {name}"
                ))
            })?;
            s.stats_retention_seconds = (minutes.max(0) as u64).saturating_mul(60);
            "The maximum time (in minutes) for keeping VM stats records in the database. The VM stats cleanup process will be disabled if this is set to 0 or less than 0."
        }
        // Only the stats settings are modelled; their text for others is not verified.
        _ => {
            return Err(ApiError::invalid_value(format!(
                "Config parameter with name {name} doesn't exist"
            )))
        }
    };
    Ok(Reply::Object(
        "configuration",
        json!({"category": "Advanced", "name": name, "value": value,
               "description": description, "isdynamic": true}),
    ))
}
