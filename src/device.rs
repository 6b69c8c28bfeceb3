//! Where KV pages live: a device ([`DeviceId`], one GPU's KV memory), or
//! the host tier shared by every device's scheduler; [`Tier`] names
//! either.

use std::fmt;

/// A device (a GPU) whose KV memory holds pages for cached tokens.
///
/// Devices are numbered `0..n` where `n` is fixed when the cache is built.
///
/// ```
/// use radixkv::DeviceId;
/// let d = DeviceId(1);
/// assert_eq!(d.index(), 1);
/// assert_eq!(d.to_string(), "device 1");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DeviceId(pub u32);

impl DeviceId {
    /// The device's index into per-device tables.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl From<u32> for DeviceId {
    fn from(v: u32) -> Self {
        DeviceId(v)
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}", self.0)
    }
}

/// A tier of KV memory: a device, or the host tier (host memory shared by
/// every device's scheduler, with
/// [`RadixCacheBuilder::host_pages`](crate::RadixCacheBuilder::host_pages)).
/// The calls that work on one tier (`insert`, `match_prefix`,
/// `match_and_pin`, `evict`, `sizes`, `resident_tokens`, `alloc`,
/// `allocator`, `copy_prefix`, the eviction metrics) take
/// `impl Into<Tier>`, so a [`DeviceId`] names a device's tier as it is;
/// a request (`RadixCache::begin`) runs on a device.
///
/// ```
/// use radixkv::{DeviceId, RadixCache, Tier, TokenKey};
/// let c = RadixCache::builder().devices(2).host_pages(64).build().unwrap();
/// c.insert(TokenKey::new(&[1, 2, 3]), Tier::Host, &[7, 8, 9], 0).unwrap();
/// c.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[4, 5], 0).unwrap();
/// assert_eq!(c.resident_tokens(Tier::Host).unwrap(), 3);
/// assert_eq!(Tier::from(DeviceId(1)).device(), Some(DeviceId(1)));
/// assert_eq!(Tier::Host.to_string(), "the host tier");
/// // Without a host tier, naming it is an error.
/// let plain = RadixCache::builder().build().unwrap();
/// assert!(plain.resident_tokens(Tier::Host).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// A device's KV memory.
    Device(DeviceId),
    /// The host tier.
    Host,
}

impl Tier {
    /// The device, if this is a device's tier.
    pub fn device(self) -> Option<DeviceId> {
        match self {
            Tier::Device(d) => Some(d),
            Tier::Host => None,
        }
    }

    /// Whether this is the host tier.
    pub fn is_host(self) -> bool {
        self == Tier::Host
    }
}

impl From<DeviceId> for Tier {
    fn from(d: DeviceId) -> Self {
        Tier::Device(d)
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tier::Device(d) => d.fmt(f),
            Tier::Host => f.write_str("the host tier"),
        }
    }
}
