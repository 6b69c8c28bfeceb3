//! Device identities.

use std::fmt;

/// A device (GPU, or a host tier) that can hold KV pages for cached tokens.
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
