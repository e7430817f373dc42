//! Fresh output vectors written block by block in parallel, each block zeroed by the thread that
//! then writes it, not the whole vector first on the calling thread.
//!
//! The language models' CPU operations (`super::lm`, `super::gemm::matmul_packed`) each return a
//! new activation of megabytes (a Llama MLP's gate and up projections of 512 tokens: 6 MB). Made
//! as `vec![0f32; len]`, the zero-fill ran on one thread before the parallel part and wrote the
//! memory once more than needed; on SmolLM2-135M's latent codes (`perf`, two threads) `memset`
//! took about 4 % of the time, with the other thread idle. Here each block's zeroing runs in
//! its task, just before the kernel writes the same cache lines.

// The workspace denies `unsafe`: a vector's spare capacity is seen as floats once zeroed, and the
// vector's length set once every block has been.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use rayon::prelude::*;

/// New vectors of the lengths `lens`, vector `j` cut into consecutive blocks of `blocks[j]`
/// floats (the last one shorter), and `f(i, outs)` run for every block index `i`, `outs[j]`
/// block `i` of vector `j` (empty past its end), zeroed first: in parallel (rayon) when its pool
/// has more than one thread, else in order on this thread (`super::cpu::for_blocks`).
///
/// # Shapes
/// `lens`, `blocks` of one length (each block length positive); returns one vector per length.
pub(crate) fn fresh_blocks(
    lens: &[usize],
    blocks: &[usize],
    f: impl Fn(usize, &mut [&mut [f32]]) + Sync + Send,
) -> Vec<Vec<f32>> {
    let mut vs: Vec<Vec<f32>> = lens.iter().map(|&n| Vec::with_capacity(n)).collect();
    let tasks = lens
        .iter()
        .zip(blocks)
        .map(|(&n, &b)| n.div_ceil(b.max(1)))
        .max()
        .unwrap_or(0);
    // Per task, its block of every vector (uninitialised).
    let mut parts: Vec<Vec<&mut [MaybeUninit<f32>]>> = (0..tasks).map(|_| Vec::new()).collect();
    for ((v, &n), &b) in vs.iter_mut().zip(lens).zip(blocks) {
        let mut chunks = v.spare_capacity_mut()[..n].chunks_mut(b.max(1));
        for part in &mut parts {
            part.push(chunks.next().unwrap_or_default());
        }
    }
    let run = |(i, part): (usize, Vec<&mut [MaybeUninit<f32>]>)| {
        let mut outs: Vec<&mut [f32]> = part
            .into_iter()
            .map(|block| {
                block.fill(MaybeUninit::new(0.0));
                // SAFETY: every element of `block` was just initialised (to 0.0), and
                // `MaybeUninit<f32>` has the layout of `f32`; the slice borrows `block`.
                unsafe {
                    std::slice::from_raw_parts_mut(block.as_mut_ptr().cast::<f32>(), block.len())
                }
            })
            .collect();
        f(i, &mut outs);
    };
    if rayon::current_num_threads() > 1 {
        parts.into_par_iter().enumerate().for_each(run);
    } else {
        parts.into_iter().enumerate().for_each(run);
    }
    for (v, &n) in vs.iter_mut().zip(lens) {
        // SAFETY: the capacity is `n`, and every one of the first `n` elements belongs to one
        // block, which its task zeroed before `f` wrote it (the tasks have all returned).
        unsafe { v.set_len(n) };
    }
    vs
}

/// One new vector of `len` floats written by `f(block index, block)` over blocks of `block`
/// floats ([`fresh_blocks`] with one vector).
pub(crate) fn fresh(
    len: usize,
    block: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    fresh_blocks(&[len], &[block], |i, outs| {
        if let Some(out) = outs.first_mut() {
            f(i, out);
        }
    })
    .pop()
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_is_written_once_in_place_and_the_rest_stays_zero() {
        // two vectors cut into 4 blocks (the second's last one short), block index written
        let vs = fresh_blocks(&[40, 25], &[10, 7], |i, outs| {
            for (j, out) in outs.iter_mut().enumerate() {
                for (e, x) in out.iter_mut().enumerate() {
                    if e % 2 == 0 {
                        *x = (100 * j + 10 * i + e) as f32;
                    }
                }
            }
        });
        assert_eq!(vs[0].len(), 40);
        assert_eq!(vs[1].len(), 25);
        for (j, (v, b)) in vs.iter().zip([10, 7]).enumerate() {
            for (p, &x) in v.iter().enumerate() {
                let (i, e) = (p / b, p % b);
                let want = if e % 2 == 0 {
                    (100 * j + 10 * i + e) as f32
                } else {
                    0.0
                };
                assert_eq!(x, want, "{j} {p}");
            }
        }
        let one = fresh(5, 2, |i, out| out.fill(i as f32 + 1.0));
        assert_eq!(one, vec![1.0, 1.0, 2.0, 2.0, 3.0]);
        assert!(fresh(0, 4, |_, _| unreachable!()).is_empty());
    }
}
