//! Members read leniently: a tool list comes from a server, and one tool whose `title` is a
//! number must cost that title, not every tool its place in the index.

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// A member that is a string, or `None` when it is anything else.
#[derive(Default)]
pub struct Str<'a>(pub Option<Cow<'a, str>>);

/// A member that is a boolean, or `None` when it is anything else.
#[derive(Default)]
pub struct Bool(pub Option<bool>);

/// A member that is an object of `T`, or `None` when it is anything else (or does not read
/// as a `T`).
pub struct Object<T>(pub Option<T>);

impl<T> Default for Object<T> {
    fn default() -> Self {
        Object(None)
    }
}

/// Skips what a visitor does not want: lists and objects are read through and dropped.
macro_rules! skip_the_rest {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
    };
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Some(Cow::Borrowed(s))))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Str<'de>, E> {
                Ok(Str(Some(Cow::Owned(s.to_owned()))))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Str<'de>, E> {
                Ok(Str(Some(Cow::Owned(s))))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Str<'de>, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Str(None))
            }
            skip_the_rest!();
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Bool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Bool;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Bool, E> {
                Ok(Bool(Some(b)))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Bool, E> {
                Ok(Bool(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Bool, E> {
                Ok(Bool(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Bool, E> {
                Ok(Bool(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Bool, E> {
                Ok(Bool(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Bool, E> {
                Ok(Bool(None))
            }
            fn visit_none<E: de::Error>(self) -> Result<Bool, E> {
                Ok(Bool(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bool, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Bool(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Bool, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Bool(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
                Ok(Object(T::deserialize(de::value::MapAccessDeserializer::new(map)).ok()))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Object<T>, E> {
                Ok(Object(None))
            }
            skip_the_rest!();
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}
