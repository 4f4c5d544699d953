//! Discovery: `listCapabilities` and `listApis`.

use serde_json::{json, Map, Value};

use crate::api::{access, Access, ApiError, Call, Reply};
use crate::world::{AccountType, World};

use super::{find, CommandSpec, COMMANDS};

pub(super) fn list_capabilities(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let s = &call.world.settings;
    let mut m = Map::new();
    m.insert("securitygroupsenabled".into(), json!(false));
    m.insert("dynamicrolesenabled".into(), json!(true));
    m.insert("cloudstackversion".into(), json!(s.cloudstack_version));
    m.insert("userpublictemplateenabled".into(), json!(false));
    m.insert("supportELB".into(), json!("false"));
    m.insert("projectinviterequired".into(), json!(false));
    m.insert("allowusercreateprojects".into(), json!(true));
    m.insert("customdiskofferingminsize".into(), json!(1));
    m.insert("customdiskofferingmaxsize".into(), json!(1024));
    m.insert("regionsecondaryenabled".into(), json!(false));
    m.insert("kvmsnapshotenabled".into(), json!(false));
    m.insert(
        "allowuserviewdestroyedvm".into(),
        json!(s.allow_user_view_destroyed_vm),
    );
    // CloudStack reports the setting, or true for admins (who may always expunge).
    let caller_admin = call.caller_account().kind != AccountType::User;
    m.insert(
        "allowuserexpungerecovervm".into(),
        json!(s.allow_user_expunge_recover_vm || caller_admin),
    );
    m.insert("allowuserexpungerecovervolume".into(), json!(false));
    m.insert("allowuserviewalldomainaccounts".into(), json!(false));
    m.insert("kubernetesserviceenabled".into(), json!(false));
    m.insert(
        "kubernetesclusterexperimentalfeaturesenabled".into(),
        json!(false),
    );
    m.insert("defaultuipagesize".into(), json!(20));
    m.insert(
        "instancesstatsretentiontime".into(),
        json!(s.stats_retention_seconds / 60),
    );
    m.insert("instancesstatsuseronly".into(), json!(false));
    m.insert("instancesdisksstatsretentionenabled".into(), json!(false));
    m.insert("instancesdisksstatsretentiontime".into(), json!(0));
    if let Some(t) = call.throttle.or(s.throttle) {
        m.insert("apilimitinterval".into(), json!(t.interval_seconds));
        m.insert("apilimitmax".into(), json!(t.max));
    }
    Ok(Reply::Object("capability", Value::Object(m)))
}

fn api_json(spec: &CommandSpec) -> Value {
    let params: Vec<Value> = spec
        .params
        .iter()
        .map(|p| {
            json!({"name": p.name, "description": p.description, "type": p.kind,
                   "required": p.required, "length": 255})
        })
        .collect();
    let mut m = Map::new();
    m.insert("name".into(), json!(spec.name));
    m.insert("description".into(), json!(spec.description));
    m.insert("isasync".into(), json!(spec.is_async));
    if !spec.since.is_empty() {
        m.insert("since".into(), json!(spec.since));
    }
    m.insert("related".into(), json!(""));
    m.insert("params".into(), Value::Array(params));
    m.insert("response".into(), json!([]));
    Value::Object(m)
}

pub(super) fn list_apis(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let w: &World = call.world;
    let allowed = |s: &CommandSpec| access(w, call.caller, s) == Access::Allowed;
    let not_found = || {
        ApiError::server(
            530,
            "Api Discovery plugin was unable to find an api by that name or process any apis",
        )
    };
    let items: Vec<Value> = match call.get_nonempty("name") {
        Some(name) => {
            let spec = find(name).ok_or_else(not_found)?;
            if !allowed(spec) {
                return Err(not_found());
            }
            vec![api_json(spec)]
        }
        None => COMMANDS
            .iter()
            .filter(|s| allowed(s))
            .map(api_json)
            .collect(),
    };
    // CloudStack's rate limiter counts one call per API name it checks for non-root callers.
    call.extra_throttle_hits = items.len() as u64;
    let count = items.len();
    Ok(Reply::List { items, count })
}
