//! SGLang's namespace pair `(extra_key, cache_salt)` and the core's
//! namespace string for it.

/// A namespace as SGLang names it: `(extra_key, cache_salt)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Namespace {
    pub(crate) extra_key: Option<String>,
    pub(crate) cache_salt: Option<String>,
}

impl Namespace {
    /// The core's namespace string for SGLang's pair: `None` for
    /// `(None, None)`, otherwise each part length-prefixed (`-` for none,
    /// `+<bytes>:<text>`), so that distinct pairs never share a string
    /// (`""` and `None` differ, as they do in SGLang).
    pub(crate) fn encode(extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<String> {
        if extra_key.is_none() && cache_salt.is_none() {
            return None;
        }
        let mut s = String::with_capacity(
            8 + extra_key.map_or(0, str::len) + cache_salt.map_or(0, str::len),
        );
        for part in [extra_key, cache_salt] {
            match part {
                None => s.push('-'),
                Some(p) => {
                    s.push('+');
                    s.push_str(&p.len().to_string());
                    s.push(':');
                    s.push_str(p);
                }
            }
        }
        Some(s)
    }

    /// The pair an [`encode`](Self::encode)d string names (`None` for a
    /// string it did not make).
    pub(crate) fn decode(ns: Option<&str>) -> Option<Namespace> {
        let Some(mut rest) = ns else {
            return Some(Namespace {
                extra_key: None,
                cache_salt: None,
            });
        };
        let mut parts = [None, None];
        for part in &mut parts {
            if let Some(r) = rest.strip_prefix('-') {
                rest = r;
                continue;
            }
            let r = rest.strip_prefix('+')?;
            let (len, r) = r.split_once(':')?;
            let len: usize = len.parse().ok()?;
            let text = r.get(..len)?;
            *part = Some(text.to_string());
            rest = &r[len..];
        }
        if !rest.is_empty() {
            return None;
        }
        let [extra_key, cache_salt] = parts;
        Some(Namespace {
            extra_key,
            cache_salt,
        })
    }
}
