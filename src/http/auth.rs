//! Who may read `/status` and `/metrics`: the Kubernetes API decides, as for CAPI's own
//! controllers (controller-runtime's `filters.WithAuthenticationAndAuthorization`) and
//! kube-controller-manager's secure port.
//!
//! 1. The request's bearer token (`Authorization: Bearer …`) is checked with a TokenReview:
//!    no token, a malformed header or a token the API does not accept is **401**.
//! 2. The user the token belongs to is checked with a SubjectAccessReview for the non-resource
//!    URL (the request path) and the verb (the lower-case method, `get`): a denial is **403**.
//!    The ClusterRole `capc-health-shim-metrics-reader` (deploy/base/rbac.yaml) grants it.
//! 3. A failed review (API server unreachable, timed out, or refusing the shim's own reviews)
//!    is **503** / **500** with what failed; it never lets the request through.
//!
//! Answers are cached per (token, verb, path) — the token only as its SHA-256 — for
//! [`ALLOW_TTL`] when allowed and [`DENY_TTL`] when refused, in a cache of at most
//! [`CACHE_CAPACITY`] entries, so a Prometheus scrape every 30 s costs two API calls a minute
//! at most. Review failures are never cached. Tokens never reach logs, errors or bodies.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::api::{Api, PostParams};

use crate::k8s::kube_error::{within, KubeError};

/// How long an allowed (token, verb, path) is trusted without asking again.
pub const ALLOW_TTL: Duration = Duration::from_secs(60);
/// How long a refused one (401 or 403) is remembered.
pub const DENY_TTL: Duration = Duration::from_secs(10);
/// Most remembered answers; the least useful are evicted first.
pub const CACHE_CAPACITY: usize = 1024;
/// The ClusterRole that grants reading `/metrics` and `/status` (deploy/base/rbac.yaml).
pub const READER_CLUSTER_ROLE: &str = "capc-health-shim-metrics-reader";

/// Why a request carries no usable bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BearerError {
    Missing,
    NotBearer,
    Malformed,
}

impl BearerError {
    pub fn message(self) -> &'static str {
        match self {
            Self::Missing => {
                "no bearer token: send `Authorization: Bearer <token>` with a Kubernetes token \
                 (e.g. `kubectl create token <service-account>`)"
            }
            Self::NotBearer => "the Authorization header is not `Bearer <token>`",
            Self::Malformed => "the bearer token is empty or not printable ASCII",
        }
    }
}

/// The bearer token of a request's `Authorization` header (scheme case-insensitive).
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, BearerError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or(BearerError::Missing)?;
    let value = value.to_str().map_err(|_| BearerError::Malformed)?;
    let (scheme, token) = value.trim().split_once(' ').ok_or(BearerError::NotBearer)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(BearerError::NotBearer);
    }
    let token = token.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(BearerError::Malformed);
    }
    Ok(token)
}

/// The user a TokenReview authenticated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What the Kubernetes API said about one (token, verb, path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed {
        user: String,
    },
    Forbidden {
        user: String,
        reason: Option<String>,
    },
    Unauthenticated,
}

/// How long a decision is remembered.
pub fn ttl(decision: &Decision) -> Duration {
    match decision {
        Decision::Allowed { .. } => ALLOW_TTL,
        Decision::Forbidden { .. } | Decision::Unauthenticated => DENY_TTL,
    }
}

/// The TokenReview for `token` (the API server's own audiences).
pub fn token_review(token: &str) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: None,
        },
        ..Default::default()
    }
}

/// The authenticated user of a TokenReview's status; `None` when it is not authenticated.
pub fn user_of(status: Option<&TokenReviewStatus>) -> Option<User> {
    let status = status?;
    if status.authenticated != Some(true) {
        return None;
    }
    let info = status.user.as_ref()?;
    let name = info.username.clone().filter(|n| !n.is_empty())?;
    Some(User {
        name,
        uid: info.uid.clone().filter(|u| !u.is_empty()),
        groups: info.groups.clone().unwrap_or_default(),
        extra: info.extra.clone().unwrap_or_default(),
    })
}

/// The SubjectAccessReview: may `user` `verb` the non-resource URL `path`?
pub fn access_review(user: &User, verb: &str, path: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: user.uid.clone(),
            groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.to_string()),
                verb: Some(verb.to_string()),
            }),
            resource_attributes: None,
        },
        ..Default::default()
    }
}

/// The decision a SubjectAccessReview's status makes: only `allowed: true` (and not `denied`)
/// lets the request through.
pub fn decision_of(user: &User, status: Option<&SubjectAccessReviewStatus>) -> Decision {
    match status {
        Some(s) if s.allowed && s.denied != Some(true) => Decision::Allowed {
            user: user.name.clone(),
        },
        _ => Decision::Forbidden {
            user: user.name.clone(),
            reason: status
                .and_then(|s| s.reason.clone().or_else(|| s.evaluation_error.clone()))
                .filter(|r| !r.trim().is_empty()),
        },
    }
}

/// A review that could not be made: the answer is `status`, never "allowed".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewError {
    pub status: StatusCode,
    pub message: String,
}

/// 503 when the API server is unreachable, slow or overloaded (try again), 500 when it refuses
/// the shim's own review (its ClusterRole lacks `create` on tokenreviews/subjectaccessreviews).
/// `token` is scrubbed from the message, should any layer have echoed it.
pub fn review_error(e: &KubeError, token: &str) -> ReviewError {
    let status = match e {
        KubeError::Unavailable { .. }
        | KubeError::Timeout { .. }
        | KubeError::Transport { .. }
        | KubeError::Conflict { .. } => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut message = e.to_string();
    if token.len() >= 8 {
        message = message.replace(token, "<redacted>");
    }
    if matches!(e, KubeError::Forbidden { .. }) {
        message.push_str(
            " (the shim's ClusterRole needs create on tokenreviews.authentication.k8s.io and \
             subjectaccessreviews.authorization.k8s.io)",
        );
    }
    ReviewError { status, message }
}

type CacheKey = ([u8; 32], String);

#[derive(Clone)]
struct Cached {
    decision: Decision,
    until: Instant,
}

fn cache_key(token: &str, verb: &str, path: &str) -> CacheKey {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut hash = [0u8; 32];
    hash.copy_from_slice(digest.as_ref());
    (hash, format!("{verb} {path}"))
}

/// Asks the Kubernetes API who a token is and whether it may read a path; remembers answers
/// briefly.
pub struct Authorizer {
    client: kube::Client,
    timeout: Duration,
    cache: quick_cache::sync::Cache<CacheKey, Cached>,
}

impl Authorizer {
    /// `timeout` bounds each review call (kube retries 429/5xx inside it).
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        Self {
            client,
            timeout,
            cache: quick_cache::sync::Cache::new(CACHE_CAPACITY),
        }
    }

    /// The decision for `token` reading `path` with `verb`: cached, else reviewed.
    pub async fn check(
        &self,
        token: &str,
        verb: &str,
        path: &str,
    ) -> Result<Decision, ReviewError> {
        let key = cache_key(token, verb, path);
        if let Some(hit) = self.cache.get(&key) {
            if Instant::now() < hit.until {
                return Ok(hit.decision);
            }
        }
        let decision = self.review(token, verb, path).await?;
        self.cache.insert(
            key,
            Cached {
                until: Instant::now() + ttl(&decision),
                decision: decision.clone(),
            },
        );
        Ok(decision)
    }

    async fn review(&self, token: &str, verb: &str, path: &str) -> Result<Decision, ReviewError> {
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let what = "TokenReview (authenticating the bearer token)";
        let reviewed = within(self.timeout, what, async {
            reviews
                .create(&PostParams::default(), &token_review(token))
                .await
                .map_err(|e| KubeError::from_kube(what, &e))
        })
        .await
        .map_err(|e| review_error(&e, token))?;
        let Some(user) = user_of(reviewed.status.as_ref()) else {
            return Ok(Decision::Unauthenticated);
        };
        let access: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let what = "SubjectAccessReview (authorizing the request)";
        let answered = within(self.timeout, what, async {
            access
                .create(&PostParams::default(), &access_review(&user, verb, path))
                .await
                .map_err(|e| KubeError::from_kube(what, &e))
        })
        .await
        .map_err(|e| review_error(&e, token))?;
        Ok(decision_of(&user, answered.status.as_ref()))
    }
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body + "\n",
    )
        .into_response()
}

fn unauthorized(why: &str) -> Response {
    let mut r = text(StatusCode::UNAUTHORIZED, format!("Unauthorized: {why}"));
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"capc-health-shim\""),
    );
    r
}

/// The answer for a refused or failed check; `None` lets the request through.
pub fn refusal(result: &Result<Decision, ReviewError>, verb: &str, path: &str) -> Option<Response> {
    match result {
        Ok(Decision::Allowed { .. }) => None,
        Ok(Decision::Unauthenticated) => Some(unauthorized(
            "the Kubernetes API did not accept the bearer token (TokenReview)",
        )),
        Ok(Decision::Forbidden { user, .. }) => Some(text(
            StatusCode::FORBIDDEN,
            format!(
                "Forbidden: user {user:?} may not {verb} {path}; bind it to the ClusterRole \
                 {READER_CLUSTER_ROLE} (nonResourceURLs /metrics and /status, verb get)"
            ),
        )),
        Err(e) => Some(text(
            e.status,
            format!(
                "cannot check the request with the Kubernetes API: {}",
                e.message
            ),
        )),
    }
}

/// The middleware that guards `/status` and `/metrics`.
pub async fn require_access(
    State(auth): State<Arc<Authorizer>>,
    request: Request,
    next: Next,
) -> Response {
    let token = match bearer_token(request.headers()) {
        Ok(t) => t.to_string(),
        Err(e) => return unauthorized(e.message()),
    };
    let verb = request.method().as_str().to_ascii_lowercase();
    let path = request.uri().path().to_string();
    let result = auth.check(&token, &verb, &path).await;
    drop(token);
    match &result {
        Ok(Decision::Forbidden { user, reason }) => {
            tracing::debug!(%user, %verb, %path, reason = reason.as_deref().unwrap_or(""), "request forbidden")
        }
        Ok(Decision::Unauthenticated) => tracing::debug!(%path, "bearer token not accepted"),
        Err(e) => {
            tracing::warn!(%path, status = %e.status, error = %e.message, "cannot review a request")
        }
        Ok(Decision::Allowed { .. }) => {}
    }
    match refusal(&result, &verb, &path) {
        Some(response) => response,
        None => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;

    fn headers(auth: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            header::HeaderValue::from_bytes(auth).unwrap(),
        );
        h
    }

    #[test]
    fn bearer_tokens_are_taken_only_from_a_well_formed_header() {
        assert_eq!(bearer_token(&HeaderMap::new()), Err(BearerError::Missing));
        assert_eq!(bearer_token(&headers(b"Bearer abc.def")), Ok("abc.def"));
        assert_eq!(bearer_token(&headers(b"bearer   abc ")), Ok("abc"));
        assert_eq!(bearer_token(&headers(b"BEARER x")), Ok("x"));
        assert_eq!(
            bearer_token(&headers(b"Basic dXNlcjpwYXNz")),
            Err(BearerError::NotBearer)
        );
        assert_eq!(
            bearer_token(&headers(b"Bearer")),
            Err(BearerError::NotBearer)
        );
        assert_eq!(bearer_token(&headers(b"abc")), Err(BearerError::NotBearer));
        assert_eq!(
            bearer_token(&headers(b"Bearer a b")),
            Err(BearerError::Malformed)
        );
        assert_eq!(
            bearer_token(&headers(b"Bearer \xff\xfe")),
            Err(BearerError::Malformed)
        );
        assert!(BearerError::Missing
            .message()
            .contains("Authorization: Bearer"));
    }

    #[test]
    fn only_an_authenticated_review_with_a_user_name_yields_a_user() {
        let status = |authenticated, name: Option<&str>| TokenReviewStatus {
            authenticated,
            user: Some(UserInfo {
                username: name.map(str::to_string),
                uid: Some("u-1".into()),
                groups: Some(vec!["system:serviceaccounts".into()]),
                extra: None,
            }),
            ..Default::default()
        };
        assert_eq!(user_of(None), None);
        assert_eq!(user_of(Some(&status(Some(false), Some("a")))), None);
        assert_eq!(user_of(Some(&status(None, Some("a")))), None);
        assert_eq!(user_of(Some(&status(Some(true), Some("")))), None);
        assert_eq!(user_of(Some(&status(Some(true), None))), None);
        let u = user_of(Some(&status(
            Some(true),
            Some("system:serviceaccount:ns:prom"),
        )))
        .unwrap();
        assert_eq!(u.name, "system:serviceaccount:ns:prom");
        assert_eq!(u.uid.as_deref(), Some("u-1"));
        assert_eq!(u.groups, vec!["system:serviceaccounts"]);
    }

    #[test]
    fn the_access_review_asks_for_the_non_resource_url_and_verb() {
        let user = User {
            name: "alice".into(),
            uid: None,
            groups: vec!["g".into()],
            extra: BTreeMap::from([("scopes".to_string(), vec!["x".to_string()])]),
        };
        let sar = access_review(&user, "get", "/metrics");
        let v = serde_json::to_value(&sar).unwrap();
        assert_eq!(v["spec"]["user"], "alice");
        assert_eq!(v["spec"]["groups"][0], "g");
        assert_eq!(v["spec"]["extra"]["scopes"][0], "x");
        assert_eq!(v["spec"]["nonResourceAttributes"]["path"], "/metrics");
        assert_eq!(v["spec"]["nonResourceAttributes"]["verb"], "get");
        assert!(v["spec"].get("resourceAttributes").is_none());
        assert!(v["spec"].get("uid").is_none());
        // And the token review carries the token only in its spec.
        let tr = serde_json::to_value(token_review("tok-123")).unwrap();
        assert_eq!(tr["spec"]["token"], "tok-123");
    }

    #[test]
    fn only_an_explicit_allow_lets_a_request_through() {
        let user = User {
            name: "bob".into(),
            ..Default::default()
        };
        let allowed = SubjectAccessReviewStatus {
            allowed: true,
            ..Default::default()
        };
        assert_eq!(
            decision_of(&user, Some(&allowed)),
            Decision::Allowed { user: "bob".into() }
        );
        let contradictory = SubjectAccessReviewStatus {
            allowed: true,
            denied: Some(true),
            ..Default::default()
        };
        assert!(matches!(
            decision_of(&user, Some(&contradictory)),
            Decision::Forbidden { .. }
        ));
        let error = SubjectAccessReviewStatus {
            allowed: false,
            evaluation_error: Some("webhook down".into()),
            ..Default::default()
        };
        assert_eq!(
            decision_of(&user, Some(&error)),
            Decision::Forbidden {
                user: "bob".into(),
                reason: Some("webhook down".into())
            }
        );
        assert!(matches!(
            decision_of(&user, None),
            Decision::Forbidden { .. }
        ));
        assert_eq!(ttl(&Decision::Allowed { user: "bob".into() }), ALLOW_TTL);
        assert_eq!(ttl(&Decision::Unauthenticated), DENY_TTL);
    }

    #[test]
    fn failed_reviews_are_5xx_name_the_cause_and_never_the_token() {
        let token = "eyJhbGciOiJSUzI1NiJ9.secret-part";
        let forbidden = KubeError::Forbidden {
            what: "TokenReview".into(),
            code: 403,
            message: format!("cannot create tokenreviews; token {token}"),
        };
        let e = review_error(&forbidden, token);
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            e.message.contains("create on tokenreviews"),
            "{}",
            e.message
        );
        assert!(!e.message.contains(token));
        let timeout = KubeError::Timeout {
            what: "TokenReview".into(),
            after: Duration::from_secs(5),
        };
        assert_eq!(
            review_error(&timeout, token).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let unavailable = KubeError::Unavailable {
            what: "SubjectAccessReview".into(),
            code: 503,
            message: "etcd".into(),
        };
        let e = review_error(&unavailable, token);
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        let r = refusal(&Err(e), "get", "/status").unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn refusals_are_401_with_a_challenge_and_403_naming_the_role() {
        let r = refusal(&Ok(Decision::Unauthenticated), "get", "/metrics").unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert!(r.headers().contains_key(header::WWW_AUTHENTICATE));
        let r = refusal(
            &Ok(Decision::Forbidden {
                user: "u".into(),
                reason: None,
            }),
            "get",
            "/metrics",
        )
        .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(refusal(&Ok(Decision::Allowed { user: "u".into() }), "get", "/x").is_none());
    }

    #[test]
    fn cache_keys_hash_the_token_and_keep_paths_apart() {
        let a = cache_key("token-a", "get", "/metrics");
        assert_eq!(a, cache_key("token-a", "get", "/metrics"));
        assert_ne!(a, cache_key("token-b", "get", "/metrics"));
        assert_ne!(a, cache_key("token-a", "get", "/status"));
        assert!(!a.1.contains("token-a"));
        assert_ne!(&a.0[..7], b"token-a");
    }
}
