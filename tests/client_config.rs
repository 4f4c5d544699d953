//! Client configuration: the CAPC credentials Secret, TLS material, redaction of secrets.

#[path = "client_support.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use capc_health_shim::cloudstack::client::{
    ClientConfig, CloudStackClient, Credentials, RetryPolicy,
};
use capc_health_shim::cloudstack::ratelimit::RateLimit;
use capc_health_shim::cloudstack::CloudStackError;
use support::{API_KEY, SECRET};

/// A self-signed CA certificate (public part only), generated for these tests.
const TEST_CA_PEM: &str = "\
-----BEGIN CERTIFICATE-----\n\
MIIDKTCCAhGgAwIBAgIUbBsjg6vIvZ+rg4i3O7ZpCsByM7AwDQYJKoZIhvcNAQEL\n\
BQAwIzEhMB8GA1UEAwwYY2FwYy1oZWFsdGgtc2hpbSB0ZXN0IENBMCAXDTI2MTEz\n\
MDA1MTMxMloYDzIxMjYxMTA2MDUxMzEyWjAjMSEwHwYDVQQDDBhjYXBjLWhlYWx0\n\
aC1zaGltIHRlc3QgQ0EwggEiMA0GCSqGSIb3DQEBAQUAA4IBDwAwggEKAoIBAQDa\n\
LFyHnrl8mm5MS0DKvN+h55U3PIpSGvCAfhEVXg2ycM7a6VKVjke5oKjEKCRMsEtB\n\
acHf4Zs8KpqqshKFvM7lryZkcgNQJpbKB/dqTFumaCnhir6muQV+Z5ygKzU7SEYl\n\
SELoOMmzS/0cg/ry4ZODfXFpStWQ5zLEPlSZYw9gBxExU8WeaUxotR9IkhnQbLT6\n\
gnDnb53ZEtLvZrPqtVWFokOzRn9tNJ+XCR6Z2XYExfH+xOGa0rHHYMH/mJGaxR5F\n\
slIKhRBdSIJO5EUrHfd/qbMjwEOfTex8NYPWpOhgIaIqR4MGHoc3nW6aRkeB67BZ\n\
nYB7FypvvX+bTar4AWDbAgMBAAGjUzBRMB0GA1UdDgQWBBSfufeTs8sqoXgWOisP\n\
tLSdoUZR0TAfBgNVHSMEGDAWgBSfufeTs8sqoXgWOisPtLSdoUZR0TAPBgNVHRMB\n\
Af8EBTADAQH/MA0GCSqGSIb3DQEBCwUAA4IBAQC2DuXKSWg/UmdpQ50tLFdZr4qz\n\
/0U81xIJOL9XvIJkqo0P64BvxhdIiE1vaXNmuq3kCmmtIGoGV7hq+1P+z9h4DP1z\n\
VTu4RW8qkQpV/8iA/2u6g66QydOy3bxox4iww4OKVYZNGk/GSSht3+x4tUpzzmXL\n\
EXLtqYQ/PVNsGu0AMkiIck4/q5vZRf25V60IFYp5J+c1xBzGO9gK2Qt8uxiNmJ32\n\
fvpw7Xk9wdJmNuFkGmv1VlDropcc69nhGQ30gl4yr3VnPCi2V4k2Fb8Sy7usXWEa\n\
0bPhm/2bVkSY/Z5sXUHV/zjdS9nNHmeK3SWCB5SWdtXBwazwdOeFjXLjemop\n\
-----END CERTIFICATE-----\n\
";

fn secret_data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect()
}

/// Neither the sentinel secret nor the full API key appears in Debug or Display.
fn assert_clean(text: &str) {
    assert!(!text.contains(SECRET), "secret leaked: {text}");
    assert!(!text.contains(API_KEY), "full api key shown: {text}");
}

fn config_error(r: Result<ClientConfig, CloudStackError>) -> CloudStackError {
    let e = r.expect_err("expected a config error");
    assert_eq!(e.kind(), "config", "{e:?}");
    assert!(!e.is_retryable());
    assert_clean(&format!("{e} {e:?}"));
    e
}

#[test]
fn config_from_a_capc_secret() {
    let data = secret_data(&[
        ("api-url", "https://cloud.example.com/client/api\n"),
        ("api-key", API_KEY),
        ("secret-key", &format!("{SECRET}\n")),
        ("verify-ssl", "false"),
    ]);
    let c = ClientConfig::from_secret_data(&data).unwrap();
    assert_eq!(c.api_url.as_str(), "https://cloud.example.com/client/api");
    assert_eq!(c.credentials.api_key(), API_KEY);
    assert!(!c.verify_tls);
    assert_eq!(c.page_size, 500);
    assert_eq!(c.signature_lifetime, Duration::from_secs(300));
    assert_clean(&format!("{c:?}"));
    assert!(format!("{c:?}").contains("test…ghij"), "{c:?}");

    // verify-ssl absent or true keeps verification on
    for v in [None, Some("true"), Some("TRUE"), Some(" 1 ")] {
        let mut d = data.clone();
        match v {
            None => {
                d.remove("verify-ssl");
            }
            Some(v) => {
                d.insert("verify-ssl".into(), v.as_bytes().to_vec());
            }
        }
        assert!(
            ClientConfig::from_secret_data(&d).unwrap().verify_tls,
            "{v:?}"
        );
    }
}

#[test]
fn secret_errors_name_the_key_and_never_the_values() {
    let full = [
        ("api-url", "https://cloud.example.com/client/api"),
        ("api-key", API_KEY),
        ("secret-key", SECRET),
    ];
    for missing in ["api-url", "api-key", "secret-key"] {
        let pairs: Vec<(&str, &str)> = full
            .iter()
            .copied()
            .filter(|(k, _)| *k != missing)
            .collect();
        let e = config_error(ClientConfig::from_secret_data(&secret_data(&pairs)));
        let text = e.to_string();
        assert!(text.contains(&format!("`{missing}`")), "{text}");
        assert!(!text.contains("cloud.example.com"), "{text}");
    }
    // an empty value, a non-UTF-8 value, a bad boolean, a bad URL
    let mut d = secret_data(&full);
    d.insert("secret-key".into(), b"   ".to_vec());
    assert!(config_error(ClientConfig::from_secret_data(&d))
        .to_string()
        .contains("`secret-key`"));
    let mut d = secret_data(&full);
    d.insert("api-key".into(), vec![0xff, 0xfe, b'k']);
    assert!(config_error(ClientConfig::from_secret_data(&d))
        .to_string()
        .contains("`api-key`"));
    let mut d = secret_data(&full);
    d.insert("verify-ssl".into(), b"SENTINEL-SECRET-XYZ-maybe".to_vec());
    let e = config_error(ClientConfig::from_secret_data(&d));
    assert!(e.to_string().contains("`verify-ssl`"));
    let mut d = secret_data(&full);
    d.insert("api-url".into(), b"cloud.example.com/client/api".to_vec());
    let e = config_error(ClientConfig::from_secret_data(&d));
    assert!(e.to_string().contains("`api-url`"), "{e}");
}

#[test]
fn credentials_debug_is_redacted() {
    let c = Credentials::new(API_KEY, SECRET).unwrap();
    let d = format!("{c:?}");
    assert_clean(&d);
    assert!(d.contains("<redacted>"));
    assert!(Credentials::new("", SECRET).is_err());
    assert!(Credentials::new(API_KEY, " ").is_err());
    let short = Credentials::new("abc", SECRET).unwrap();
    assert!(!format!("{short:?}").contains("abc"));
}

#[test]
fn client_and_config_debug_are_redacted() {
    let mut c = ClientConfig::new(
        "https://cloud.example.com/client/api",
        Credentials::new(API_KEY, SECRET).unwrap(),
    )
    .unwrap();
    c.extra_ca_pem = Some(TEST_CA_PEM.as_bytes().to_vec());
    assert_clean(&format!("{c:?}"));
    assert!(format!("{c:?}").contains("bytes>"));
    let client = CloudStackClient::new(c).unwrap();
    let d = format!("{client:?}");
    assert_clean(&d);
    assert!(d.contains("https://cloud.example.com/client/api"));
}

#[test]
fn a_valid_extra_ca_bundle_is_accepted() {
    let mut c = ClientConfig::new(
        "https://cloud.example.com/client/api",
        Credentials::new(API_KEY, SECRET).unwrap(),
    )
    .unwrap();
    c.extra_ca_pem = Some(TEST_CA_PEM.as_bytes().to_vec());
    CloudStackClient::new(c.clone()).unwrap();
    // verification off also builds
    c.verify_tls = false;
    CloudStackClient::new(c).unwrap();
}

#[test]
fn a_bad_ca_bundle_is_a_config_error() {
    let broken_der = "-----BEGIN CERTIFICATE-----\nAAAAAAAAAAAAAAAA\n-----END CERTIFICATE-----\n";
    let broken_base64 =
        "-----BEGIN CERTIFICATE-----\n!!!! not base64 !!!!\n-----END CERTIFICATE-----\n";
    for (name, pem) in [
        ("no PEM at all", "this is not a certificate"),
        ("empty", ""),
        ("bad base64", broken_base64),
        ("bad DER", broken_der),
    ] {
        let mut c = ClientConfig::new(
            "https://cloud.example.com/client/api",
            Credentials::new(API_KEY, SECRET).unwrap(),
        )
        .unwrap();
        c.extra_ca_pem = Some(pem.as_bytes().to_vec());
        let e = CloudStackClient::new(c).expect_err(name);
        assert_eq!(e.kind(), "config", "{name}: {e:?}");
        assert!(e.to_string().contains("CA bundle"), "{name}: {e}");
        assert_clean(&format!("{e} {e:?}"));
    }
}

type Mutation = Box<dyn Fn(&mut ClientConfig)>;

#[test]
fn invalid_numbers_are_config_errors() {
    let base = ClientConfig::new(
        "https://cloud.example.com/client/api",
        Credentials::new(API_KEY, SECRET).unwrap(),
    )
    .unwrap();
    let cases: Vec<(&str, Mutation)> = vec![
        ("page size 0", Box::new(|c| c.page_size = 0)),
        (
            "zero timeout",
            Box::new(|c| c.request_timeout = Duration::ZERO),
        ),
        (
            "lifetime too long",
            Box::new(|c| c.signature_lifetime = Duration::from_secs(7 * 24 * 3600)),
        ),
        (
            "no attempts",
            Box::new(|c| {
                c.retry = RetryPolicy {
                    max_attempts: 0,
                    ..RetryPolicy::default()
                }
            }),
        ),
        ("jitter > 1", Box::new(|c| c.retry.jitter = 2.0)),
        (
            "rate 0",
            Box::new(|c| {
                c.rate_limit = Some(RateLimit {
                    per_second: 0.0,
                    burst: 1,
                })
            }),
        ),
    ];
    for (name, mutate) in cases {
        let mut c = base.clone();
        mutate(&mut c);
        let e = CloudStackClient::new(c).expect_err(name);
        assert_eq!(e.kind(), "config", "{name}");
    }
    CloudStackClient::new(base).unwrap();
}
