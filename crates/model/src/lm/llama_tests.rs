//! Tests of the Llama pass (`super`): grouped-query heads, the fused steps against the unfused ones.

use super::super::layers::repeat_kv;
use super::*;

#[test]
fn repeat_kv_maps_query_head_to_kv_head_by_integer_division() {
    let x = Tensor::arange(0f32, 2.0 * 3.0, &Device::Cpu)
        .unwrap()
        .reshape((1, 2, 3, 1))
        .unwrap();
    let r = repeat_kv(&x, 3).unwrap();
    assert_eq!(r.dims(), &[1, 6, 3, 1]);
    let v = r.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    for h in 0..6 {
        for p in 0..3 {
            assert_eq!(v[h * 3 + p], ((h / 3) * 3 + p) as f32);
        }
    }
}

/// A reader without a hook function that hands on a copy (a new tensor, the same values) of
/// the products after which the pass fuses a step: the pass then takes the unfused steps.
struct Copies;

impl HookPoints for Copies {
    fn hooks(&mut self) -> Option<&mut dyn HookFn> {
        None
    }

    fn at_block(&mut self, _l: usize, point: &str, value: Tensor) -> Result<Tensor> {
        match point {
            "attn.hook_k" | "hook_attn_out" | "mlp.hook_pre_linear" | "hook_mlp_out" => {
                Ok(value.copy()?)
            }
            _ => Ok(value),
        }
    }
}

#[test]
fn the_fused_steps_give_the_bits_of_the_unfused_ones() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lm/tiny-llama-hf");
    let m = Llama::from_hf_dir(&dir, &Device::Cpu).unwrap();
    // 3 x 21 tokens: over two threads' tasks, the second shorter (rows offset in the
    // residual stream), a tail past the tiles of 8 rows
    let (b, t) = (3usize, 21usize);
    let v = m.config().vocab_size as u32;
    let ids: Vec<u32> = (0..b * t).map(|i| (i as u32 * 7919 + 13) % v).collect();
    let tokens = Tensor::from_vec(ids, (b, t), &Device::Cpu).unwrap();
    let fused = m.pass(&tokens, true, &mut NoHooks).unwrap();
    let plain = m.pass(&tokens, true, &mut Copies).unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    };
    assert_eq!(bits(&fused.logits), bits(&plain.logits));
    let (fp, pp) = (fused.patterns.unwrap(), plain.patterns.unwrap());
    assert_eq!(fp.len(), m.config().n_layers);
    for (f, p) in fp.iter().zip(&pp) {
        assert_eq!(bits(f), bits(p));
    }
}

#[test]
fn config_check_rejects_bad_grouping_and_odd_heads() {
    let ok = LlamaConfig {
        vocab_size: 5,
        d_model: 12,
        n_layers: 1,
        n_heads: 3,
        n_kv_heads: 1,
        d_head: 4,
        d_mlp: 7,
        rms_eps: 1e-5,
        rope_theta: 1e4,
        max_seq_len: 8,
        tied_embeddings: true,
    };
    assert!(ok.check().is_ok());
    assert!(LlamaConfig {
        n_kv_heads: 2,
        ..ok.clone()
    }
    .check()
    .is_err());
    assert!(LlamaConfig {
        d_head: 5,
        ..ok.clone()
    }
    .check()
    .is_err());
    assert!(LlamaConfig { d_mlp: 0, ..ok }.check().is_err());
}
