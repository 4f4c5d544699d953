//! The visitors of `parse::healthy_list_page`: wrapper → inner object → item array. Any shape
//! they do not expect is an error, which only means "read it the tolerant way".

use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeOwned, DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{item_failure, lenient_u64, ListPage};

fn declined<E: serde::de::Error>() -> E {
    E::custom("not a plain list page")
}

pub(super) struct Wrapper<'k, T> {
    pub response_key: &'k str,
    pub item_key: &'k str,
    pub item: PhantomData<T>,
}

impl<'de, T: DeserializeOwned> Visitor<'de> for Wrapper<'_, T> {
    type Value = ListPage<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{\"{}\": {{...}}}}", self.response_key)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut page = None;
        while let Some(key) = map.next_key::<&str>()? {
            if key != self.response_key || page.is_some() {
                return Err(declined());
            }
            page = Some(map.next_value_seed(Inner::<T> {
                item_key: self.item_key,
                item: PhantomData,
            })?);
        }
        page.ok_or_else(declined)
    }
}

struct Inner<'k, T> {
    item_key: &'k str,
    item: PhantomData<T>,
}

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for Inner<'_, T> {
    type Value = ListPage<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for Inner<'_, T> {
    type Value = ListPage<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{\"count\": N, \"{}\": [...]}}", self.item_key)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut count = None;
        let mut items = None;
        while let Some(key) = map.next_key::<&str>()? {
            if key == "count" && count.is_none() {
                let value: Value = map.next_value()?;
                count = Some(lenient_u64(&value).ok_or_else(declined)?);
            } else if key == self.item_key && items.is_none() {
                items = Some(map.next_value_seed(Items::<T>(PhantomData))?);
            } else {
                return Err(declined());
            }
        }
        let (items, failures, received) = items.unwrap_or_default();
        Ok(ListPage {
            count: count.unwrap_or(0),
            count_present: count.is_some(),
            received,
            items,
            failures,
        })
    }
}

/// The item array: each item read from its own slice of the body; a bad one is read again
/// the tolerant way, for the same failure as there.
struct Items<T>(PhantomData<T>);

type ReadItems<T> = (Vec<T>, Vec<super::ItemFailure>, usize);

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for Items<T> {
    type Value = ReadItems<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for Items<T> {
    type Value = ReadItems<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of items")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        let mut failures = Vec::new();
        let mut index = 0;
        while let Some(raw) = seq.next_element::<&'de RawValue>()? {
            match serde_json::from_str::<T>(raw.get()) {
                Ok(item) => items.push(item),
                Err(_) => {
                    let value: Value = serde_json::from_str(raw.get()).map_err(A::Error::custom)?;
                    match T::deserialize(&value) {
                        Ok(item) => items.push(item),
                        Err(e) => failures.push(item_failure(index, &value, &e)),
                    }
                }
            }
            index += 1;
        }
        Ok((items, failures, index))
    }
}
