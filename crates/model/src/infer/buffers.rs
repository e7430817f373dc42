//! The workers' buffers: one set per worker ([`Work`], with one problem's attention buffers in
//! `hyperlens_kernels`'s [`AttentionScratch`]), sized for a chunk of [`CHUNK`] problems, lent from [`Inference`]'s pool
//! ([`Pooled`]) and returned to it when dropped.

use hyperlens_kernels::AttentionScratch;

use super::{Inference, CHUNK};
use crate::config::Config;
use crate::ops::fast::mix::{Plan, Rows};

impl Inference {
    /// A worker's buffers: from the pool, or new when the pool is empty.
    pub(super) fn work(&self) -> Pooled<'_> {
        let kept = self.pool.lock().ok().and_then(|mut p| p.pop());
        Pooled {
            work: Some(kept.unwrap_or_else(|| Work::new(&self.config, self.plan.as_ref()))),
            pool: &self.pool,
        }
    }
}

/// A worker's buffers on loan from [`Inference`]'s pool, returned when dropped.
pub(super) struct Pooled<'a> {
    work: Option<Work>,
    pool: &'a std::sync::Mutex<Vec<Work>>,
}

impl std::ops::Deref for Pooled<'_> {
    type Target = Work;
    fn deref(&self) -> &Work {
        self.work
            .as_ref()
            .expect("the buffers are returned only on drop")
    }
}

impl std::ops::DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Work {
        self.work
            .as_mut()
            .expect("the buffers are returned only on drop")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let (Some(work), Ok(mut pool)) = (self.work.take(), self.pool.lock()) {
            pool.push(work);
        }
    }
}

/// One worker's buffers, sized for a chunk of [`CHUNK`] problems.
pub(super) struct Work {
    pub(super) resid: Vec<f32>,
    pub(super) xn: Vec<f32>,
    pub(super) qkv: Vec<f32>,
    pub(super) o: Vec<f32>,
    pub(super) y: Vec<f32>,
    pub(super) hid: Vec<f32>,
    pub(super) last: Vec<f32>,
    /// One problem's attention buffers.
    pub(super) one: AttentionScratch,
    /// The HYLA value networks' scratch (mixers with one).
    pub(super) rows: Option<Rows>,
    /// The stream and the heads' outputs of the last block's computed queries, gathered.
    pub(super) resid_c: Vec<f32>,
    /// See `resid_c`.
    pub(super) o_c: Vec<f32>,
}

impl Work {
    fn new(cfg: &Config, plan: Option<&Plan>) -> Work {
        let rows = CHUNK * cfg.n_tokens;
        let t = cfg.n_tokens;
        let (dm, hd) = (cfg.d_model, cfg.n_heads * cfg.d_head);
        Work {
            resid: vec![0.0; rows * dm],
            xn: vec![0.0; rows * dm],
            qkv: vec![0.0; rows * 3 * hd],
            o: vec![0.0; rows * hd],
            y: vec![0.0; rows * dm],
            hid: vec![0.0; rows * cfg.d_mlp],
            last: vec![0.0; CHUNK * cfg.n_outputs * dm],
            one: AttentionScratch::new(t, cfg.n_heads, cfg.d_head),
            rows: plan.map(|p| Rows::new(p, &vec![0.0; t * hd])),
            resid_c: vec![0.0; rows * dm],
            o_c: vec![0.0; rows * hd],
        }
    }
}
