//! Collections whose bound is part of the type, enforced when built, serialized and decoded.
//!
//! Decoding checks a declared length against the bound before allocating, preallocates at
//! most the bound, and refuses element N+1 before decoding it, so a forged length prefix of
//! four billion costs nothing.

use core::fmt;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use std::collections::BTreeMap;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

/// A value exceeded its bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} holds {found}, more than its bound of {bound}")]
pub struct BoundError {
    pub what: &'static str,
    pub bound: usize,
    pub found: usize,
}

impl BoundError {
    /// `found` against `bound`: the error when it is more.
    pub fn check(what: &'static str, bound: usize, found: usize) -> Result<(), BoundError> {
        if found > bound {
            Err(BoundError { what, bound, found })
        } else {
            Ok(())
        }
    }

    /// One more than `bound`: what a reader that stops at the bound reports.
    pub fn one_over(what: &'static str, bound: usize) -> BoundError {
        BoundError {
            what,
            bound,
            found: bound + 1,
        }
    }
}

/// Preallocation cap in elements: beyond it a vector grows as elements actually arrive.
const PREALLOCATE: usize = 1024;

/// A `Vec` of at most `N` elements.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BoundedVec<T, const N: usize>(Vec<T>);

impl<T, const N: usize> BoundedVec<T, N> {
    pub const BOUND: usize = N;

    pub const fn new() -> Self {
        Self(Vec::new())
    }

    pub fn push(&mut self, value: T) -> Result<(), BoundError> {
        BoundError::check("list", N, self.0.len() + 1)?;
        self.0.push(value);
        Ok(())
    }

    pub fn into_vec(self) -> Vec<T> {
        self.0
    }

    /// Sorts in place (records are published sorted).
    pub fn sort(&mut self)
    where
        T: Ord,
    {
        self.0.sort();
    }
}

impl<T, const N: usize> Default for BoundedVec<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> TryFrom<Vec<T>> for BoundedVec<T, N> {
    type Error = BoundError;
    fn try_from(values: Vec<T>) -> Result<Self, BoundError> {
        BoundError::check("list", N, values.len())?;
        Ok(Self(values))
    }
}

impl<T, const N: usize> Deref for BoundedVec<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

/// Elements may change in place; the length, which the bound is about, cannot.
impl<T, const N: usize> DerefMut for BoundedVec<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a BoundedVec<T, N> {
    type Item = &'a T;
    type IntoIter = core::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<T, const N: usize> IntoIterator for BoundedVec<T, N> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<T: fmt::Debug, const N: usize> fmt::Debug for BoundedVec<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Serialize, const N: usize> Serialize for BoundedVec<T, N> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        BoundError::check("list", N, self.0.len()).map_err(serde::ser::Error::custom)?;
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for value in &self.0 {
            seq.serialize_element(value)?;
        }
        seq.end()
    }
}

/// Fails on any element: used to probe for element N+1 without decoding it.
struct Refuse<T>(usize, PhantomData<T>);

impl<'de, T> DeserializeSeed<'de> for Refuse<T> {
    type Value = T;
    fn deserialize<D: Deserializer<'de>>(self, _: D) -> Result<T, D::Error> {
        Err(de::Error::custom(BoundError::one_over("list", self.0)))
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for BoundedVec<T, N> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SeqVisitor<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for SeqVisitor<T, N> {
            type Value = BoundedVec<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of at most {N} elements")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let hint = seq.size_hint().unwrap_or(0);
                BoundError::check("list", N, hint).map_err(de::Error::custom)?;
                let mut values = Vec::with_capacity(hint.min(PREALLOCATE));
                while values.len() < N {
                    match seq.next_element()? {
                        Some(value) => values.push(value),
                        None => return Ok(BoundedVec(values)),
                    }
                }
                match seq.next_element_seed(Refuse::<T>(N, PhantomData))? {
                    None => Ok(BoundedVec(values)),
                    Some(_) => Err(de::Error::custom(BoundError::one_over("list", N))),
                }
            }
        }
        deserializer.deserialize_seq(SeqVisitor::<T, N>(PhantomData))
    }
}

/// An ordered map of at most `N` entries; keys are unique (a repeated key is an error).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BoundedMap<K, V, const N: usize>(BTreeMap<K, V>);

impl<K: Ord, V, const N: usize> BoundedMap<K, V, N> {
    pub const BOUND: usize = N;

    pub const fn new() -> Self {
        Self(BTreeMap::new())
    }

    /// Inserts or replaces; refuses a new key beyond the bound.
    pub fn insert(&mut self, key: K, value: V) -> Result<Option<V>, BoundError> {
        BoundError::check("map", N, self.0.len() + 1)?;
        Ok(self.0.insert(key, value))
    }

    pub fn into_inner(self) -> BTreeMap<K, V> {
        self.0
    }
}

impl<K: Ord, V, const N: usize> Default for BoundedMap<K, V, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord, V, const N: usize> TryFrom<BTreeMap<K, V>> for BoundedMap<K, V, N> {
    type Error = BoundError;
    fn try_from(map: BTreeMap<K, V>) -> Result<Self, BoundError> {
        BoundError::check("map", N, map.len())?;
        Ok(Self(map))
    }
}

impl<K, V, const N: usize> Deref for BoundedMap<K, V, N> {
    type Target = BTreeMap<K, V>;
    fn deref(&self) -> &BTreeMap<K, V> {
        &self.0
    }
}

impl<K: fmt::Debug, V: fmt::Debug, const N: usize> fmt::Debug for BoundedMap<K, V, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<K: Serialize, V: Serialize, const N: usize> Serialize for BoundedMap<K, V, N> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        BoundError::check("map", N, self.0.len()).map_err(serde::ser::Error::custom)?;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl<'de, K, V, const N: usize> Deserialize<'de> for BoundedMap<K, V, N>
where
    K: Deserialize<'de> + Ord + fmt::Debug,
    V: Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<K, V, const N: usize>(PhantomData<(K, V)>);
        impl<'de, K, V, const N: usize> Visitor<'de> for MapVisitor<K, V, N>
        where
            K: Deserialize<'de> + Ord + fmt::Debug,
            V: Deserialize<'de>,
        {
            type Value = BoundedMap<K, V, N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a map of at most {N} entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let hint = access.size_hint().unwrap_or(0);
                BoundError::check("map", N, hint).map_err(de::Error::custom)?;
                let mut map = BTreeMap::new();
                while map.len() < N {
                    let Some(key) = access.next_key::<K>()? else {
                        return Ok(BoundedMap(map));
                    };
                    if map.contains_key(&key) {
                        return Err(de::Error::custom(format_args!("duplicate map key {key:?}")));
                    }
                    let value = access.next_value()?;
                    map.insert(key, value);
                }
                match access.next_key_seed(Refuse::<K>(N, PhantomData))? {
                    None => Ok(BoundedMap(map)),
                    Some(_) => Err(de::Error::custom(BoundError::one_over("map", N))),
                }
            }
        }
        deserializer.deserialize_map(MapVisitor::<K, V, N>(PhantomData))
    }
}

/// UTF-8 text of at most `N` bytes.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BoundedString<const N: usize>(String);

impl<const N: usize> BoundedString<N> {
    pub const BOUND: usize = N;

    /// Cuts `text` at a character boundary to fit; for human-readable messages, where a
    /// shortened message beats a lost one.
    pub fn truncating(text: &str) -> Self {
        if text.len() <= N {
            return Self(text.to_owned());
        }
        let mut end = N;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        Self(text[..end].to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<const N: usize> TryFrom<String> for BoundedString<N> {
    type Error = BoundError;
    fn try_from(text: String) -> Result<Self, BoundError> {
        BoundError::check("string", N, text.len())?;
        Ok(Self(text))
    }
}

impl<const N: usize> TryFrom<&str> for BoundedString<N> {
    type Error = BoundError;
    fn try_from(text: &str) -> Result<Self, BoundError> {
        Self::try_from(text.to_owned())
    }
}

impl<const N: usize> Deref for BoundedString<N> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<const N: usize> fmt::Debug for BoundedString<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<const N: usize> fmt::Display for BoundedString<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<const N: usize> Serialize for BoundedString<N> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        BoundError::check("string", N, self.0.len()).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(&self.0)
    }
}

impl<'de, const N: usize> Deserialize<'de> for BoundedString<N> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor<const N: usize>;
        impl<const N: usize> Visitor<'_> for StrVisitor<N> {
            type Value = BoundedString<N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a string of at most {N} bytes")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                BoundedString::try_from(text).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(StrVisitor::<N>)
    }
}
