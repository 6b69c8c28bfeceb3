//! A msgpack reader over one payload, item by item, borrowing strings and
//! bytes from it: what [`crate::decode`] reads a batch with, straight into
//! its typed events, without building a value tree first. Markers are
//! rmp's ([`rmp::Marker`]); this reader only walks them.
//!
//! An array or a map is read as its header ([`Item::Array`],
//! [`Item::Map`]); its elements follow as further items. [`Reader::skip`]
//! passes over one whole value.

use rmp::Marker;

/// One msgpack item: a scalar, or the header of an array or a map.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Item<'a> {
    Nil,
    Bool(bool),
    /// An integer at least 0 (whichever marker encoded it).
    Uint(u64),
    /// An integer below 0.
    Int(i64),
    Float(f64),
    /// A string's bytes (not checked to be UTF-8).
    Str(&'a [u8]),
    Bin(&'a [u8]),
    /// An array of this many elements.
    Array(usize),
    /// A map of this many pairs.
    Map(usize),
    /// An extension value (skipped whole).
    Ext,
}

impl Item<'_> {
    /// What it is, as a phrase (for errors).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Item::Nil => "nil",
            Item::Bool(_) => "a boolean",
            Item::Uint(_) | Item::Int(_) => "an integer",
            Item::Float(_) => "a float",
            Item::Str(_) => "a string",
            Item::Bin(_) => "bytes",
            Item::Array(_) => "a list",
            Item::Map(_) => "a map",
            Item::Ext => "an extension",
        }
    }

    /// The string, if it is one and UTF-8.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Item::Str(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }
}

/// The payload is not msgpack: cut short, or a reserved marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub String);

/// A position in a payload.
#[derive(Clone, Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    /// Bytes read so far.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Goes back (or forth) to `pos`, an earlier [`Reader::pos`].
    pub(crate) fn seek(&mut self, pos: usize) {
        self.pos = pos.min(self.buf.len());
    }

    /// Bytes not read yet.
    pub(crate) fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        match self.buf.get(self.pos..).and_then(|r| r.get(..n)) {
            Some(b) => {
                self.pos += n;
                Ok(b)
            }
            None => Err(Malformed(format!(
                "cut short: {n} bytes wanted at offset {} of {}",
                self.pos,
                self.buf.len()
            ))),
        }
    }

    #[inline]
    fn be<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        let b = self.take(N)?;
        let mut out = [0; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn len8(&mut self) -> Result<usize, Malformed> {
        Ok(usize::from(self.be::<1>()?[0]))
    }

    fn len16(&mut self) -> Result<usize, Malformed> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }

    fn len32(&mut self) -> Result<usize, Malformed> {
        Ok(u32::from_be_bytes(self.be()?) as usize)
    }

    fn signed(v: i64) -> Item<'a> {
        if v >= 0 {
            Item::Uint(v as u64)
        } else {
            Item::Int(v)
        }
    }

    /// The next item.
    pub(crate) fn item(&mut self) -> Result<Item<'a>, Malformed> {
        let m = Marker::from_u8(self.be::<1>()?[0]);
        Ok(match m {
            Marker::FixPos(v) => Item::Uint(u64::from(v)),
            Marker::FixNeg(v) => Item::Int(i64::from(v)),
            Marker::Null => Item::Nil,
            Marker::True => Item::Bool(true),
            Marker::False => Item::Bool(false),
            Marker::U8 => Item::Uint(u64::from(self.be::<1>()?[0])),
            Marker::U16 => Item::Uint(u64::from(u16::from_be_bytes(self.be()?))),
            Marker::U32 => Item::Uint(u64::from(u32::from_be_bytes(self.be()?))),
            Marker::U64 => Item::Uint(u64::from_be_bytes(self.be()?)),
            Marker::I8 => Self::signed(i64::from(i8::from_be_bytes(self.be()?))),
            Marker::I16 => Self::signed(i64::from(i16::from_be_bytes(self.be()?))),
            Marker::I32 => Self::signed(i64::from(i32::from_be_bytes(self.be()?))),
            Marker::I64 => Self::signed(i64::from_be_bytes(self.be()?)),
            Marker::F32 => Item::Float(f64::from(f32::from_be_bytes(self.be()?))),
            Marker::F64 => Item::Float(f64::from_be_bytes(self.be()?)),
            Marker::FixStr(n) => Item::Str(self.take(usize::from(n))?),
            Marker::Str8 => {
                let n = self.len8()?;
                Item::Str(self.take(n)?)
            }
            Marker::Str16 => {
                let n = self.len16()?;
                Item::Str(self.take(n)?)
            }
            Marker::Str32 => {
                let n = self.len32()?;
                Item::Str(self.take(n)?)
            }
            Marker::Bin8 => {
                let n = self.len8()?;
                Item::Bin(self.take(n)?)
            }
            Marker::Bin16 => {
                let n = self.len16()?;
                Item::Bin(self.take(n)?)
            }
            Marker::Bin32 => {
                let n = self.len32()?;
                Item::Bin(self.take(n)?)
            }
            Marker::FixArray(n) => Item::Array(usize::from(n)),
            Marker::Array16 => Item::Array(self.len16()?),
            Marker::Array32 => Item::Array(self.len32()?),
            Marker::FixMap(n) => Item::Map(usize::from(n)),
            Marker::Map16 => Item::Map(self.len16()?),
            Marker::Map32 => Item::Map(self.len32()?),
            Marker::FixExt1 | Marker::FixExt2 | Marker::FixExt4 | Marker::FixExt8 => {
                let n = match m {
                    Marker::FixExt1 => 1,
                    Marker::FixExt2 => 2,
                    Marker::FixExt4 => 4,
                    _ => 8,
                };
                self.take(1 + n)?;
                Item::Ext
            }
            Marker::FixExt16 => {
                self.take(17)?;
                Item::Ext
            }
            Marker::Ext8 | Marker::Ext16 | Marker::Ext32 => {
                let n = match m {
                    Marker::Ext8 => self.len8()?,
                    Marker::Ext16 => self.len16()?,
                    _ => self.len32()?,
                };
                self.take(1 + n)?;
                Item::Ext
            }
            Marker::Reserved => {
                return Err(Malformed(format!(
                    "the reserved marker 0xc1 at offset {}",
                    self.pos - 1
                )))
            }
        })
    }

    /// Passes over the elements of `item` (an array's or a map's, when it
    /// is one of those; nothing otherwise), `item` itself just read.
    pub(crate) fn skip_rest(&mut self, item: Item<'_>) -> Result<(), Malformed> {
        // Values still to pass over; each item takes at least a byte, so a
        // count past what is left ends in `Malformed`, not a long loop.
        let mut left: u64 = match item {
            Item::Array(n) => n as u64,
            Item::Map(n) => 2 * n as u64,
            _ => 0,
        };
        while left > 0 {
            left -= 1;
            match self.item()? {
                Item::Array(n) => left += n as u64,
                Item::Map(n) => left += 2 * n as u64,
                _ => {}
            }
        }
        Ok(())
    }

    /// Passes over one whole value.
    pub(crate) fn skip(&mut self) -> Result<(), Malformed> {
        let item = self.item()?;
        self.skip_rest(item)
    }

    /// The next value when it is an unsigned integer of at most 32 bits
    /// whose bytes are all there (a positive fixint, `uint 8`, `uint 16` or
    /// `uint 32`: every token id), passed over; `None` (nothing read)
    /// otherwise, for [`item`](Self::item) to read or refuse.
    #[inline(always)]
    fn uint_fast(&mut self) -> Option<u32> {
        let rest = self.buf.get(self.pos..)?;
        let (v, n) = match *rest.first()? {
            b @ 0..=0x7f => (u32::from(b), 1),
            0xcc => (u32::from(*rest.get(1)?), 2),
            0xcd => (
                u32::from(u16::from_be_bytes(*rest.get(1..3)?.first_chunk()?)),
                3,
            ),
            0xce => (u32::from_be_bytes(*rest.get(1..5)?.first_chunk()?), 5),
            _ => return None,
        };
        self.pos += n;
        Some(v)
    }

    /// The next value when it is a `uint 64` or `int 64` whose bytes are
    /// all there (how block hashes are sent), passed over, as `u64` (an
    /// `int 64` as its two's complement, the bits [`Item::Int`] or
    /// [`Item::Uint`] carry for it); `None` (nothing read) otherwise.
    #[inline(always)]
    pub(crate) fn word_fast(&mut self) -> Option<u64> {
        let rest = self.buf.get(self.pos..)?;
        match *rest.first()? {
            0xcf | 0xd3 => {
                let v = u64::from_be_bytes(*rest.get(1..9)?.first_chunk()?);
                self.pos += 9;
                Some(v)
            }
            _ => None,
        }
    }

    /// An array of token ids as `u32`s, the array's header just read (`n`
    /// elements): `Err` names the first element that is not one (the
    /// array is then passed over whole).
    pub(crate) fn u32s(&mut self, n: usize) -> Result<Result<Vec<u32>, usize>, Malformed> {
        // At least a byte an element: a claimed length past what is left
        // reserves no more than the payload could hold.
        let mut out = Vec::with_capacity(n.min(self.left()));
        for i in 0..n {
            // The common case without `item`'s general match.
            let v = match self.uint_fast() {
                Some(v) => Some(v),
                None => match self.item()? {
                    Item::Uint(v) => u32::try_from(v).ok(),
                    other => {
                        self.skip_rest(other)?;
                        None
                    }
                },
            };
            match v {
                Some(v) => out.push(v),
                None => {
                    for _ in i + 1..n {
                        self.skip()?;
                    }
                    return Ok(Err(i));
                }
            }
        }
        Ok(Ok(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut v = Vec::new();
        f(&mut v);
        v
    }

    #[test]
    fn every_width_of_integer_reads_as_its_value() {
        let p = encoded(|p| {
            rmp::encode::write_uint(p, 5).unwrap();
            rmp::encode::write_uint(p, 300).unwrap();
            rmp::encode::write_uint(p, 1 << 40).unwrap();
            rmp::encode::write_sint(p, -3).unwrap();
            rmp::encode::write_sint(p, i64::MIN).unwrap();
            rmp::encode::write_i8(p, 7).unwrap();
            rmp::encode::write_f32(p, 1.5).unwrap();
        });
        let mut r = Reader::new(&p);
        let items: Vec<Item> = (0..7).map(|_| r.item().unwrap()).collect();
        assert_eq!(
            items,
            [
                Item::Uint(5),
                Item::Uint(300),
                Item::Uint(1 << 40),
                Item::Int(-3),
                Item::Int(i64::MIN),
                Item::Uint(7),
                Item::Float(1.5)
            ]
        );
        assert_eq!(r.left(), 0);
    }

    #[test]
    fn skip_passes_over_nested_values_and_extensions() {
        let p = encoded(|p| {
            rmp::encode::write_map_len(p, 2).unwrap();
            rmp::encode::write_str(p, "a").unwrap();
            rmp::encode::write_array_len(p, 2).unwrap();
            rmp::encode::write_bin(p, &[1, 2, 3]).unwrap();
            rmp::encode::write_ext_meta(p, 3, 9).unwrap();
            p.extend_from_slice(&[0; 3]);
            rmp::encode::write_str(p, "b").unwrap();
            rmp::encode::write_nil(p).unwrap();
            rmp::encode::write_uint(p, 42).unwrap();
        });
        let mut r = Reader::new(&p);
        r.skip().unwrap();
        assert_eq!(r.item().unwrap(), Item::Uint(42));
    }

    #[test]
    fn cut_short_lengths_past_the_payload_and_the_reserved_marker_are_malformed() {
        assert!(Reader::new(&[0xcb, 0, 0]).item().is_err());
        // An array claiming 2^32 - 1 elements in six bytes.
        assert!(Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01])
            .skip()
            .is_err());
        assert!(Reader::new(&[0xc1]).item().is_err());
        let mut r = Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01]);
        let Item::Array(n) = r.item().unwrap() else {
            panic!()
        };
        assert!(r.u32s(n).is_err());
    }

    #[test]
    fn u32s_names_the_first_bad_element_and_passes_the_rest() {
        let p = encoded(|p| {
            rmp::encode::write_array_len(p, 4).unwrap();
            rmp::encode::write_uint(p, 1).unwrap();
            rmp::encode::write_uint(p, 70_000).unwrap();
            rmp::encode::write_uint(p, 1 << 33).unwrap();
            rmp::encode::write_array_len(p, 1).unwrap();
            rmp::encode::write_uint(p, 1).unwrap();
            rmp::encode::write_uint(p, 9).unwrap();
        });
        let mut r = Reader::new(&p);
        let Item::Array(n) = r.item().unwrap() else {
            panic!()
        };
        assert_eq!(r.u32s(n).unwrap(), Err(2));
        assert_eq!(r.item().unwrap(), Item::Uint(9));
        let mut ok = encoded(|p| {
            rmp::encode::write_array_len(p, 2).unwrap();
            rmp::encode::write_uint(p, 127).unwrap();
            rmp::encode::write_uint(p, 1 << 31).unwrap();
        });
        ok.push(0);
        let mut r = Reader::new(&ok);
        let Item::Array(n) = r.item().unwrap() else {
            panic!()
        };
        assert_eq!(r.u32s(n).unwrap(), Ok(vec![127, 1 << 31]));
    }

    /// Each value written at every width that holds it, and each of those
    /// encodings cut short at every length and followed by more bytes.
    fn encodings() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for v in [
            0u64,
            1,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            1 << 31,
            u64::from(u32::MAX),
            1 << 32,
            u64::MAX,
        ] {
            out.push(encoded(|p| drop(rmp::encode::write_uint(p, v))));
            if let Ok(b) = u8::try_from(v) {
                out.push(encoded(|p| drop(rmp::encode::write_u8(p, b))));
            }
            if let Ok(b) = u16::try_from(v) {
                out.push(encoded(|p| drop(rmp::encode::write_u16(p, b))));
            }
            if let Ok(b) = u32::try_from(v) {
                out.push(encoded(|p| drop(rmp::encode::write_u32(p, b))));
            }
            out.push(encoded(|p| drop(rmp::encode::write_u64(p, v))));
            out.push(encoded(|p| drop(rmp::encode::write_i64(p, v as i64))));
            out.push(encoded(|p| {
                drop(rmp::encode::write_sint(p, -(v as i64 & 0xffff)))
            }));
        }
        out.push(encoded(|p| drop(rmp::encode::write_str(p, "x"))));
        out.push(encoded(|p| drop(rmp::encode::write_f64(p, 2.0))));
        let whole = out.clone();
        for e in whole {
            for cut in 0..e.len() {
                out.push(e[..cut].to_vec());
            }
            // With more after it (what a reader must not take).
            let mut more = e.clone();
            more.extend_from_slice(&[0xff; 8]);
            out.push(more);
        }
        out
    }

    #[test]
    fn the_fast_readers_read_what_item_reads_or_leave_it_to_item() {
        for e in encodings() {
            let mut r = Reader::new(&e);
            let by_item = r.item();
            let taken = r.pos();
            let mut r = Reader::new(&e);
            match r.uint_fast() {
                Some(v) => {
                    assert_eq!(by_item, Ok(Item::Uint(u64::from(v))), "{e:02x?}");
                    assert_eq!(r.pos(), taken, "{e:02x?}");
                }
                None => assert_eq!(r.pos(), 0, "{e:02x?}"),
            }
            let mut r = Reader::new(&e);
            match r.word_fast() {
                Some(w) => {
                    let bits = match by_item {
                        Ok(Item::Uint(u)) => u,
                        Ok(Item::Int(i)) => i as u64,
                        other => panic!("{e:02x?}: {other:?}"),
                    };
                    assert_eq!(w, bits, "{e:02x?}");
                    assert_eq!(r.pos(), taken, "{e:02x?}");
                }
                None => assert_eq!(r.pos(), 0, "{e:02x?}"),
            }
            // In a one-element array, u32s answers as item reads it there.
            let mut a = vec![0x91];
            a.extend_from_slice(&e);
            let mut r = Reader::new(&a);
            assert_eq!(r.item(), Ok(Item::Array(1)));
            let want = match r.clone().item() {
                Ok(Item::Uint(v)) => Ok(u32::try_from(v).map(|v| vec![v]).map_err(|_| 0)),
                Ok(_) => Ok(Err(0)),
                Err(m) => Err(m),
            };
            assert_eq!(r.u32s(1), want, "{e:02x?}");
        }
    }
}
