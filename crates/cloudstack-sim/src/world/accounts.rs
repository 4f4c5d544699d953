//! Accounts and their keys, dynamic roles and rule matching, API throttle settings, and
//! projects (accounts' shared VM ownership).

use std::fmt;

use super::{new_uuid, unique_name, World, WorldError};

/// CloudStack account types (`Account.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccountType {
    User,
    Admin,
    DomainAdmin,
    ResourceAdmin,
}

impl AccountType {
    pub const ALL: [AccountType; 4] = [
        AccountType::User,
        AccountType::Admin,
        AccountType::DomainAdmin,
        AccountType::ResourceAdmin,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "User" => Some(Self::User),
            "Admin" => Some(Self::Admin),
            "DomainAdmin" => Some(Self::DomainAdmin),
            "ResourceAdmin" => Some(Self::ResourceAdmin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "User",
            Self::Admin => "Admin",
            Self::DomainAdmin => "DomainAdmin",
            Self::ResourceAdmin => "ResourceAdmin",
        }
    }

    /// The numeric `accounttype` CloudStack reports.
    pub fn code(self) -> u8 {
        match self {
            Self::User => 0,
            Self::Admin => 1,
            Self::DomainAdmin => 2,
            Self::ResourceAdmin => 3,
        }
    }
}

/// A secret string whose `Debug`/`Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// One dynamic-role rule: an API name pattern (`*` matches any run of characters) and
/// whether it allows or denies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleRule {
    pub rule: String,
    pub allow: bool,
}

/// A dynamic role: ordered rules, first match decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    pub name: String,
    /// The role type (`User`, `DomainAdmin`, …) used by the annotation fallback.
    pub kind: AccountType,
    pub rules: Vec<RoleRule>,
    /// CloudStack allows an API that matches no rule when the command's annotation lists the
    /// role type. Off by default in the simulator so that "no rule" is always 432.
    pub annotation_fallback: bool,
}

/// Result of checking an API name against a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleDecision {
    Allow,
    Deny,
    NoRule,
}

impl Role {
    pub fn decide(&self, api: &str) -> RoleDecision {
        for r in &self.rules {
            if rule_matches(&r.rule, api) {
                return if r.allow {
                    RoleDecision::Allow
                } else {
                    RoleDecision::Deny
                };
            }
        }
        RoleDecision::NoRule
    }
}

/// Glob match where `*` matches any (possibly empty) run of characters; case-sensitive.
pub fn rule_matches(pattern: &str, name: &str) -> bool {
    let p = pattern.as_bytes();
    let n = name.as_bytes();
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// API throttling settings (`api.throttling.max` / `api.throttling.interval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Throttle {
    pub max: u64,
    pub interval_seconds: u64,
}

#[derive(Debug, Clone)]
pub struct Account {
    pub id: String,
    pub name: String,
    pub kind: AccountType,
    pub user_id: String,
    pub username: String,
    pub api_key: String,
    pub secret_key: Secret,
    pub role: Option<Role>,
    /// Per-account throttle; `None` uses the global setting.
    pub throttle: Option<Throttle>,
    pub enabled: bool,
}

impl Account {
    /// Root admin = `Admin` type (the simulator has only the ROOT domain).
    pub fn is_root_admin(&self) -> bool {
        self.kind == AccountType::Admin
    }
}

#[derive(Debug, Clone)]
pub struct Project {
    pub id: String,
    pub name: String,
    /// Name of the project's owning account (`PrjAcct-…`), shown as `account` on its VMs.
    pub account_name: String,
    /// Accounts (indices) that are members.
    pub members: Vec<usize>,
}

impl World {
    #[allow(clippy::too_many_arguments)]
    pub fn add_account(
        &mut self,
        name: &str,
        id: Option<&str>,
        kind: AccountType,
        api_key: &str,
        secret_key: &str,
        role: Option<Role>,
        throttle: Option<Throttle>,
    ) -> Result<usize, WorldError> {
        unique_name(&self.accounts, |a| &a.name, "account", name)?;
        if api_key.is_empty() || secret_key.is_empty() {
            return Err(WorldError::Invalid(format!(
                "account {name:?} needs a non-empty api key and secret key"
            )));
        }
        if self.accounts.iter().any(|a| a.api_key == api_key) {
            return Err(WorldError::Conflict(format!(
                "account {name:?} reuses another account's api key"
            )));
        }
        let id = self.check_id(id, "account", |i| self.accounts.iter().any(|a| a.id == i))?;
        self.accounts.push(Account {
            id,
            name: name.to_string(),
            kind,
            user_id: new_uuid(),
            username: name.to_string(),
            api_key: api_key.to_string(),
            secret_key: Secret::new(secret_key),
            role,
            throttle,
            enabled: true,
        });
        Ok(self.accounts.len() - 1)
    }

    /// The keys (api, secret) of the first enabled root admin: type Admin, no dynamic role
    /// (the built-in Root Admin role may call every API, DynamicRoleBasedAPIAccessChecker.java@5e8d8028).
    pub fn root_admin_keys(&self) -> Option<(String, String)> {
        self.accounts
            .iter()
            .find(|a| a.enabled && a.kind == AccountType::Admin && a.role.is_none())
            .map(|a| (a.api_key.clone(), a.secret_key.expose().to_string()))
    }

    pub fn account_index(&self, name: &str) -> Option<usize> {
        self.accounts.iter().position(|a| a.name == name)
    }

    pub fn account_by_api_key(&self, key: &str) -> Option<usize> {
        self.accounts.iter().position(|a| a.api_key == key)
    }

    pub fn add_project(
        &mut self,
        name: &str,
        id: Option<&str>,
        members: &[String],
    ) -> Result<usize, WorldError> {
        unique_name(&self.projects, |p| &p.name, "project", name)?;
        let mut m = Vec::new();
        for a in members {
            m.push(self.account_index(a).ok_or_else(|| {
                WorldError::NotFound(format!("project {name:?}: unknown member account {a:?}"))
            })?);
        }
        let id = self.check_id(id, "project", |i| self.projects.iter().any(|p| p.id == i))?;
        let account_name = format!("PrjAcct-{name}-{}", self.projects.len() + 1);
        self.projects.push(Project {
            id,
            name: name.to_string(),
            account_name,
            members: m,
        });
        Ok(self.projects.len() - 1)
    }

    pub fn project_index(&self, name_or_id: &str) -> Option<usize> {
        self.projects
            .iter()
            .position(|p| p.name == name_or_id || p.id == name_or_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_rules() {
        assert!(rule_matches("*", "listVirtualMachines"));
        assert!(rule_matches("list*", "listVirtualMachines"));
        assert!(rule_matches("list*Machines", "listVirtualMachines"));
        assert!(!rule_matches("list*", "deployVirtualMachine"));
        assert!(rule_matches("listNics", "listNics"));
        assert!(!rule_matches("listnics", "listNics"));
        assert!(!rule_matches("listNics", "listNicsX"));
    }
}
