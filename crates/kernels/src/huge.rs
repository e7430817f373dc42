//! Buffers of floats on transparent huge pages, for a language model's packed weights
//! ([`crate::PackedMatrix`]).
//!
//! The packed weights (417 MB for SmolLM2-135M) are read once per batch, from memory, and with
//! 4 KiB pages every 4 KiB of a panel costs a TLB miss. A buffer of 2 MiB or more here is an
//! anonymous mapping of its own that starts on a 2 MiB page, and Linux is asked to back its whole
//! 2 MiB pages with transparent huge pages (`madvise(MADV_HUGEPAGE)`, which the kernel's default
//! `madvise` mode of THP waits for) before they are first written; the partial page at its end
//! stays on 4 KiB pages, so no memory is spent on a huge page it would not fill. One thread's
//! products of SmolLM2-135M's shapes over 30 layers of weights took 433-443 ms with these pages
//! against 547-570 ms without (two interleaved runs in one process, 307 of the 430 MB on huge
//! pages; `CHANGELOG.md`). Advice only: where Linux declines (THP off) the pages are ordinary
//! ones, and the values are the same.
//!
//! Not the heap: a 2 MiB-aligned allocation there fitted worse into the holes that the model's
//! freed load-time tensors left, and `probe` took 55 MB more; an unaligned one put only a third
//! of the weights on huge pages. With the weights in mappings of their own, those holes are
//! handed back to Linux instead ([`trim_heap`]).

// The workspace denies `unsafe`: a mapping of its own (`mmap`), which a `Vec` cannot own.
#![allow(unsafe_code)]

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Bytes of a transparent huge page of x86-64 Linux.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Alignment of a buffer below [`HUGE_PAGE`] bytes (a cache line).
const LINE_BYTES: usize = 64;

/// `len` floats owned like a `Vec<f32>` of fixed length; from 2 MiB on (on Linux) a mapping of
/// their own that starts on a 2 MiB page (module docs).
pub(crate) struct HugePageBuffer {
    ptr: NonNull<f32>,
    len: usize,
    /// How the floats were allocated, and so are freed.
    from: Source,
}

/// Where a [`HugePageBuffer`]'s floats live.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// The global allocator, with this layout (size 0: nothing allocated).
    Heap(Layout),
    /// An anonymous mapping of this many bytes (Linux).
    Map(usize),
}

// SAFETY: the buffer owns its floats alone, as a `Vec<f32>` does; shared references only read.
unsafe impl Send for HugePageBuffer {}
// SAFETY: as above.
unsafe impl Sync for HugePageBuffer {}

impl HugePageBuffer {
    /// `len` zeros; on Linux from 2 MiB on, on huge pages (module docs).
    ///
    /// # Panics
    /// When `len` floats exceed the address space; aborts as `Vec` does when memory runs out.
    pub(crate) fn zeroed(len: usize) -> Self {
        let bytes = len
            .checked_mul(std::mem::size_of::<f32>())
            .expect("huge-page buffer: size overflows");
        if bytes >= HUGE_PAGE {
            trim_heap();
            if let Some((ptr, mapped)) = map_huge(bytes) {
                return Self {
                    ptr,
                    len,
                    from: Source::Map(mapped),
                };
            }
        }
        let layout = Layout::from_size_align(bytes, LINE_BYTES).expect("huge-page buffer: layout");
        if bytes == 0 {
            return Self {
                ptr: NonNull::dangling(),
                len: 0,
                from: Source::Heap(layout),
            };
        }
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) }.cast::<f32>();
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        Self {
            ptr,
            len,
            from: Source::Heap(layout),
        }
    }
}

/// A fresh anonymous mapping of `bytes` (zeros, not yet backed by memory) that starts on a 2 MiB
/// page, its whole 2 MiB pages advised `MADV_HUGEPAGE`: the pointer and the bytes mapped (`bytes`
/// rounded up to whole pages). `None` off Linux or when the mapping fails (the caller then takes
/// the heap).
#[cfg(target_os = "linux")]
fn map_huge(bytes: usize) -> Option<(NonNull<f32>, usize)> {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0 && HUGE_PAGE.is_multiple_of(p))?;
    let mapped = bytes.next_multiple_of(page);
    let over = mapped.checked_add(HUGE_PAGE)?;
    // SAFETY: a new private anonymous mapping (no address asked for, no file).
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            over,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let addr = raw as usize;
    let start = addr.next_multiple_of(HUGE_PAGE);
    let (head, tail) = (start - addr, addr + over - (start + mapped));
    // SAFETY: the head and the tail are whole pages of the mapping just made, outside the
    // `mapped` bytes kept (both are multiples of the page size: `addr`, `HUGE_PAGE` and
    // `mapped` are); the kept range is then advised, which changes no contents.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((start + mapped) as *mut libc::c_void, tail);
        }
        libc::madvise(
            start as *mut libc::c_void,
            bytes / HUGE_PAGE * HUGE_PAGE,
            libc::MADV_HUGEPAGE,
        );
    }
    NonNull::new(start as *mut f32).map(|p| (p, mapped))
}

/// No huge pages off Linux.
#[cfg(not(target_os = "linux"))]
fn map_huge(_: usize) -> Option<(NonNull<f32>, usize)> {
    None
}

/// Hands the heap's free memory back to Linux (glibc's `malloc_trim(0)`, which also releases
/// free pages inside the heap, not only at its top). A buffer on a mapping of its own no longer
/// takes the place in the heap that its inputs left when they were freed (a model's weights are
/// dequantized, packed and dropped one matrix after another): without this, `hyperlens probe` on
/// SmolLM2-135M peaked at 960 MB instead of 807 MB (801 MB with it). No-op off glibc.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions (it takes the allocator's locks itself).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Unmaps what [`map_huge`] kept (`bytes` from `ptr`); called once, by the buffer's `drop`.
#[cfg(target_os = "linux")]
fn unmap(ptr: NonNull<f32>, bytes: usize) {
    // SAFETY: `ptr..ptr + bytes` is a mapping `map_huge` made and kept, unmapped only here.
    unsafe { libc::munmap(ptr.as_ptr().cast(), bytes) };
}

/// Nothing is mapped off Linux.
#[cfg(not(target_os = "linux"))]
fn unmap(_: NonNull<f32>, _: usize) {}

impl Deref for HugePageBuffer {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: `ptr` holds `len` initialised floats (zeros at first; or is dangling with
        // `len` 0), owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HugePageBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HugePageBuffer {
    fn drop(&mut self) {
        match self.from {
            Source::Heap(layout) if layout.size() > 0 => {
                // SAFETY: allocated in `zeroed` with this layout, and freed only here.
                unsafe { dealloc(self.ptr.as_ptr().cast(), layout) };
            }
            Source::Heap(_) => {}
            Source::Map(mapped) => unmap(self.ptr, mapped),
        }
    }
}

impl Clone for HugePageBuffer {
    fn clone(&self) -> Self {
        let mut copy = Self::zeroed(self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl std::fmt::Debug for HugePageBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugePageBuffer({} floats, {:?})", self.len, self.from)
    }
}

impl PartialEq for HugePageBuffer {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}
