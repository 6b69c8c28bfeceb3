//! A node's image: an immutable snapshot of its parent link, key and
//! values per tier, in one allocation, replaced copy-on-write (through the
//! lock guards of `protocol::lock`) whenever the node is split or a
//! residency is added or removed. Key, values and parent therefore always
//! agree with each other for a reader that loaded one image.
//!
//! ```text
//!  one allocation:  [ parent | values per tier | len ][ key: len × u32 ]
//!                     ImageHead (repr(C), offset 0)     the tail
//! ```
//!
//! Generic over the node type `N` (the parent link's pointee) so that this
//! file names no node.

use super::ptr::ParentPtr;
use super::values::{head_and_words, DeviceValues};
use crossbeam_epoch::{Owned, Pointable, Pointer, Shared};
use std::alloc::Layout;

/// An immutable snapshot of a node's position, key and values, in one
/// allocation: a fixed [`ImageHead`], then the key's tokens. Inline, the
/// key costs no reference count, no fat pointer and no separate
/// allocation, and a reader that loads the image finds the tokens it
/// compares next to it instead of behind one more pointer. The price is a
/// copy of the key whenever an image is replaced (a residency added or
/// removed, a split), which is rarer than the reads.
///
/// Reached through `Atomic<Image<N>>` like any other epoch-managed object:
/// the [`Pointable`] implementation below turns the thin address crossbeam
/// keeps into a reference (the head holds the key's length).
#[repr(C)]
pub(crate) struct Image<N> {
    head: ImageHead<N>,
    /// The node's tokens (page-aligned, non-empty except for roots).
    pub(crate) key: [u32],
}

/// The fixed part of an [`Image`], at its start (offset 0: `repr(C)`).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct ImageHead<N> {
    /// The parent this image was published under.
    pub(crate) parent: ParentPtr<N>,
    /// The values of the node's tokens on each tier where it is resident.
    pub(crate) values: DeviceValues,
    /// The key's length in tokens (the metadata of the `key` tail).
    len: usize,
}

/// What a new image is made of; [`boxed`] copies the key into it.
#[derive(Debug)]
pub(crate) struct ImageParts<'k, N> {
    /// See [`ImageHead::parent`].
    pub(crate) parent: ParentPtr<N>,
    /// The tokens, copied into the image.
    pub(crate) key: &'k [u32],
    /// See [`ImageHead::values`].
    pub(crate) values: DeviceValues,
}

/// An owned [`ImageParts`]: what `Owned::<Image<N>>::init` takes
/// ([`Pointable::Init`]). The tree builds images through [`boxed`], which
/// borrows the key instead.
#[derive(Debug)]
pub(crate) struct ImageInit<N> {
    pub(crate) parent: ParentPtr<N>,
    pub(crate) key: Box<[u32]>,
    pub(crate) values: DeviceValues,
}

impl<N> std::ops::Deref for Image<N> {
    type Target = ImageHead<N>;
    fn deref(&self) -> &ImageHead<N> {
        &self.head
    }
}

impl<N> std::fmt::Debug for Image<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("parent", &self.head.parent)
            .field("key", &&self.key)
            .field("values", &self.head.values)
            .finish()
    }
}

impl<N> Drop for Image<N> {
    fn drop(&mut self) {
        // The loom probe of freed images (a no-op without loom).
        crate::sync::probe::died(self as *const Image<N> as *const () as usize);
    }
}

impl<N> Image<N> {
    /// The allocation of an image with a key of `len` tokens, and the
    /// key's offset in it (`repr(C)`: see `values::head_and_words`).
    fn layout(len: usize) -> (Layout, usize) {
        head_and_words::<ImageHead<N>>(len)
    }

    /// Allocates an image of `parts` and returns its address.
    fn write(parent: ParentPtr<N>, key: &[u32], values: DeviceValues) -> usize {
        let (layout, offset) = Self::layout(key.len());
        // SAFETY: `layout` has a non-zero size (the head is not empty).
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `p` is a fresh allocation of `layout`, aligned for the
        // head (its alignment is the layout's) with `offset` the key's
        // place in it, `key.len()` `u32`s long (see `layout`); nothing else
        // can see it yet. The head's `len` is the key's length, so the
        // reference `fat` builds covers exactly what was written.
        unsafe {
            p.cast::<ImageHead<N>>().write(ImageHead {
                parent,
                values,
                len: key.len(),
            });
            std::ptr::copy_nonoverlapping(key.as_ptr(), p.add(offset).cast::<u32>(), key.len());
            debug_assert_eq!(
                Layout::for_value(&*Self::fat(p as usize)),
                layout,
                "the computed layout is the type's"
            );
        }
        p as usize
    }

    /// The wide pointer to the image at thin address `ptr`.
    ///
    /// # Safety
    /// `ptr` came from [`Image::write`] and was not freed yet.
    unsafe fn fat(ptr: usize) -> *mut Image<N> {
        // SAFETY: the caller's contract: the head was written at `ptr`.
        let len = unsafe { (*(ptr as *const ImageHead<N>)).len };
        // A slice pointer of the key's length, cast to the struct whose
        // tail is that slice: the same address and metadata.
        std::ptr::slice_from_raw_parts_mut(ptr as *mut u32, len) as *mut Image<N>
    }
}

// What crossbeam relies on (the trait is safe to implement, its methods
// are `unsafe fn`): `init` returns the address of an allocation aligned to
// `ALIGN` (the head's alignment is the layout's, `Image::layout`), holding a
// head and the key it describes; `deref`/`deref_mut` rebuild the reference
// from the head's length, and `drop` drops the head and frees the
// allocation with the layout it was made with. crossbeam calls these only
// on addresses `init` returned (or `from_usize` got from `Image::write`,
// the same allocation), as its contract says.
impl<N> Pointable for Image<N> {
    const ALIGN: usize = std::mem::align_of::<ImageHead<N>>();
    type Init = ImageInit<N>;

    unsafe fn init(init: ImageInit<N>) -> usize {
        Self::write(init.parent, &init.key, init.values)
    }

    unsafe fn deref<'a>(ptr: usize) -> &'a Image<N> {
        // SAFETY: crossbeam's contract (`ptr` is live, not mutably borrowed).
        unsafe { &*Self::fat(ptr) }
    }

    unsafe fn deref_mut<'a>(ptr: usize) -> &'a mut Image<N> {
        // SAFETY: crossbeam's contract (`ptr` is live and not borrowed).
        unsafe { &mut *Self::fat(ptr) }
    }

    unsafe fn drop(ptr: usize) {
        // SAFETY: crossbeam's contract: `ptr` is live and nobody else can
        // reach it. The image is dropped in place (its head's values; the
        // key needs nothing), then its allocation freed with its layout.
        unsafe {
            let (layout, _) = Self::layout((*(ptr as *const ImageHead<N>)).len);
            std::ptr::drop_in_place(Self::fat(ptr));
            std::alloc::dealloc(ptr as *mut u8, layout);
        }
    }
}

/// Boxes an image for publication (and registers it with the loom probe).
pub(crate) fn boxed<N>(parts: ImageParts<'_, N>) -> Owned<Image<N>> {
    let addr = Image::write(parts.parent, parts.key, parts.values);
    crate::sync::probe::born(addr);
    // SAFETY: `addr` is a live image from `Image::write`, owned by no one
    // else: what `Owned` requires of it (see the `Pointable` impl).
    unsafe { Owned::from_usize(addr) }
}

/// The thin address of an image (what the loom probe keeps).
pub(crate) fn image_addr<N>(img: Shared<'_, Image<N>>) -> usize {
    img.into_usize()
}
