//! Lenient field readers: CloudStack sends some numbers as strings, and a field that does
//! not parse should make that field absent rather than fail the whole page.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::CsTime;

pub fn u64_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Number(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64)),
        // an integer as such (via f64 it would lose digits above 2^53), else `"1024.0"`
        Value::String(s) => {
            let s = s.trim();
            s.parse::<u64>().ok().or_else(|| {
                s.parse::<f64>()
                    .ok()
                    .filter(|f| *f >= 0.0)
                    .map(|f| f as u64)
            })
        }
        _ => None,
    })
}

pub fn i64_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => {
            let s = s.trim();
            s.parse::<i64>()
                .ok()
                .or_else(|| s.parse::<f64>().ok().map(|f| f as i64))
        }
        _ => None,
    })
}

pub fn bool_or_false<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Bool(b) => b,
        Value::String(s) => s.eq_ignore_ascii_case("true"),
        _ => false,
    })
}

pub fn bool_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Bool(b) => Some(b),
        Value::String(s) if s.eq_ignore_ascii_case("true") => Some(true),
        Value::String(s) if s.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    })
}

pub fn string_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) if !s.is_empty() => Some(s),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    })
}

pub fn time_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<CsTime>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => CsTime::parse(&s).ok(),
        _ => None,
    })
}

/// A list that may be absent, `null`, or (rarely) a single object instead of an array;
/// any other scalar reads as empty. Items are read straight from the input (a VM's NICs
/// went through a `serde_json::Value` tree first: a tenth of a 10 000-VM poll's CPU).
pub fn vec_or_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    use serde::de::value::MapAccessDeserializer;
    use serde::de::{MapAccess, SeqAccess, Visitor};

    struct ListVisitor<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list, one object, or null")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
            while let Some(item) = seq.next_element()? {
                out.push(item);
            }
            // Kept for the whole poll: a VM's one NIC in a Vec grown to four would be 3/4 slack.
            out.shrink_to_fit();
            Ok(out)
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<T>, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map)).map(|one| vec![one])
        }

        fn visit_none<E>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Vec<T>, D2::Error> {
            d.deserialize_any(self)
        }

        fn visit_unit<E>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_bool<E>(self, _: bool) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_i64<E>(self, _: i64) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_u64<E>(self, _: u64) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_f64<E>(self, _: f64) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_str<E>(self, _: &str) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }
    }
    d.deserialize_any(ListVisitor(std::marker::PhantomData))
}
