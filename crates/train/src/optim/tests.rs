//! Tests of the AdamW update against a plain float64 reference (`optim/mod.rs`).

use super::*;
use candle_core::Device;

/// Plain float64 AdamW, written independently of the tensor code.
fn reference(theta: &mut [f64], m: &mut [f64], v: &mut [f64], g: &[f64], t: i32, lr: f64, wd: f64) {
    let (b1, b2, eps) = (0.9, 0.999, 1e-8);
    for i in 0..theta.len() {
        m[i] = b1 * m[i] + (1.0 - b1) * g[i];
        v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
        let mh = m[i] / (1.0 - b1.powi(t));
        let vh = v[i] / (1.0 - b2.powi(t));
        theta[i] -= lr * (mh / (vh.sqrt() + eps) + wd * theta[i]);
    }
}

#[test]
fn matches_reference_and_masks_decay() -> Result<()> {
    let dev = Device::Cpu;
    let init2: Vec<f32> = (0..6).map(|i| 0.3 * i as f32 - 0.7).collect();
    let init1: Vec<f32> = vec![0.5, -0.25, 1.5];
    let w = Var::from_vec(init2.clone(), (2, 3), &dev)?;
    let b = Var::from_vec(init1.clone(), 3, &dev)?;
    let mut opt = AdamW::new(
        vec![("w".into(), w.clone()), ("b".into(), b.clone())],
        AdamWParams {
            weight_decay: 0.1,
            ..Default::default()
        },
    )?;
    let mut tw: Vec<f64> = init2.iter().map(|&x| x as f64).collect();
    let mut tb: Vec<f64> = init1.iter().map(|&x| x as f64).collect();
    let (mut mw, mut vw, mut mb, mut vb) = (vec![0.0; 6], vec![0.0; 6], vec![0.0; 3], vec![0.0; 3]);
    for t in 1..=5 {
        // loss = sum(w^2 * c) + sum(b^3) so gradients depend on the current values.
        let c = Tensor::new(&[[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &dev)?;
        let loss =
            ((w.as_tensor().sqr()? * &c)?.sum_all()? + b.as_tensor().powf(3.0)?.sum_all()?)?;
        let grads = loss.backward()?;
        let lr = 0.01 * t as f64;
        opt.step(&grads, lr)?;
        let cw = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let gw: Vec<f64> = (0..6).map(|i| 2.0 * tw[i] * cw[i]).collect();
        let gb: Vec<f64> = (0..3).map(|i| 3.0 * tb[i] * tb[i]).collect();
        reference(&mut tw, &mut mw, &mut vw, &gw, t, lr, 0.1);
        reference(&mut tb, &mut mb, &mut vb, &gb, t, lr, 0.0);
    }
    let got_w: Vec<f32> = w.as_tensor().flatten_all()?.to_vec1()?;
    let got_b: Vec<f32> = b.as_tensor().to_vec1()?;
    for (g, r) in got_w.iter().zip(&tw).chain(got_b.iter().zip(&tb)) {
        assert!((*g as f64 - r).abs() < 1e-5, "{g} vs {r}");
    }
    // State round trip.
    let (state, step) = opt.state()?;
    assert_eq!(step, 5);
    assert_eq!(state.len(), 4);
    // The moments are plain values: holding the backward graph would keep every step's forward
    // pass alive (memory grew by gigabytes over a few hundred steps before this was fixed).
    assert!(state.values().all(|t| !t.track_op()));
    let mut other = AdamW::new(
        vec![("w".into(), w.clone()), ("b".into(), b.clone())],
        AdamWParams::default(),
    )?;
    other.load_state(&state, step)?;
    assert_eq!(other.step_count(), 5);
    let mut bad = state.clone();
    bad.remove("m.w");
    assert!(other.load_state(&bad, 5).is_err());
    Ok(())
}

#[test]
fn missing_gradient_updates_nothing_and_bad_vars_are_rejected() -> Result<()> {
    let dev = Device::Cpu;
    let w = Var::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], (2, 2), &dev)?;
    let b = Var::from_vec(vec![0.5f32], 1, &dev)?;
    let mut opt = AdamW::new(
        vec![("w".into(), w.clone()), ("b".into(), b.clone())],
        AdamWParams::default(),
    )?;
    // `b` takes no part in the loss, so it has no gradient.
    let grads = w.as_tensor().sum_all()?.backward()?;
    assert_eq!(opt.step(&grads, 0.1)?, vec!["b".to_string()]);
    assert_eq!(opt.step_count(), 0);
    assert_eq!(
        w.as_tensor().flatten_all()?.to_vec1::<f32>()?,
        vec![1.0, 2.0, 3.0, 4.0]
    );
    let (state, _) = opt.state()?;
    assert!(state.values().all(|t| t
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .all(|&x| x == 0.0)));
    assert_eq!(state["m.w"].dims(), &[2, 2]);
    assert_eq!(state["v.b"].dims(), &[1]);
    let f64_var = Var::from_vec(vec![1.0f64], 1, &dev)?;
    assert!(matches!(
        AdamW::new(vec![("x".into(), f64_var)], AdamWParams::default()),
        Err(TrainError::InvalidParam(_))
    ));
    // No parameters at all: updates are counted and do nothing.
    let mut empty = AdamW::new(Vec::new(), AdamWParams::default())?;
    assert!(empty.step(&grads, 0.1)?.is_empty());
    assert_eq!(empty.step_count(), 1);
    Ok(())
}

/// Rates kept on the host (what the fused CUDA update takes) give the composed update the
/// same bits as the rates it makes itself, shared or per model; on the CPU nothing is fused.
#[test]
fn host_rates_give_the_composed_update_its_own_bits() -> Result<()> {
    let dev = Device::Cpu;
    let c = Tensor::new(&[[1.0f32, -2.0, 3.0], [4.0, 5.0, -6.0]], &dev)?;
    for lrs in [[0.01, 0.01], [0.01, 0.03]] {
        let make = || -> Result<(Var, AdamW)> {
            let init: Vec<f32> = (0..12).map(|i| 0.2 * i as f32 - 1.1).collect();
            let w = Var::from_vec(init, (2, 2, 3), &dev)?;
            let opt = AdamW::stacked(
                vec![("w".into(), w.clone())],
                AdamWParams::default(),
                &[0.1, 0.2],
            )?;
            Ok((w, opt))
        };
        let (wa, mut a) = make()?;
        let (wb, mut b) = make()?;
        assert!(!a.is_fused());
        for _ in 0..3 {
            let ga = (wa.as_tensor().sqr()?.broadcast_mul(&c))?
                .sum_all()?
                .backward()?;
            let gb = (wb.as_tensor().sqr()?.broadcast_mul(&c))?
                .sum_all()?
                .backward()?;
            a.step_each(&ga, &lrs)?;
            b.step_with(&gb, &Rates::Host(lrs.to_vec()))?;
        }
        let bits = |w: &Var| -> Vec<u32> {
            let v: Vec<f32> = w.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(&wa), bits(&wb), "{lrs:?}");
    }
    Ok(())
}

/// A stacked optimiser over two models with their own learning rates and weight decays
/// updates each model's row as that model's own optimiser does, bit for bit, and exports and
/// restores each model's state with the single model's names and shapes.
#[test]
fn stacked_rows_are_the_single_optimisers() -> Result<()> {
    let dev = Device::Cpu;
    let w0: Vec<f32> = (0..6).map(|i| 0.3 * i as f32 - 0.7).collect();
    let w1: Vec<f32> = (0..6).map(|i| 0.2 - 0.15 * i as f32).collect();
    let (b0, b1) = (vec![0.5f32, -0.25, 1.5], vec![-0.1f32, 0.7, 0.05]);
    let singles = [
        (
            Var::from_vec(w0.clone(), (2, 3), &dev)?,
            Var::from_vec(b0.clone(), 3, &dev)?,
        ),
        (
            Var::from_vec(w1.clone(), (2, 3), &dev)?,
            Var::from_vec(b1.clone(), 3, &dev)?,
        ),
    ];
    let ws = Var::from_tensor(&Tensor::stack(
        &[
            Tensor::from_vec(w0, (2, 3), &dev)?,
            Tensor::from_vec(w1, (2, 3), &dev)?,
        ],
        0,
    )?)?;
    let bs = Var::from_tensor(&Tensor::stack(
        &[
            Tensor::from_vec(b0, 3, &dev)?,
            Tensor::from_vec(b1, 3, &dev)?,
        ],
        0,
    )?)?;
    let (lrs, wds) = ([0.01, 0.03], [0.1, 0.3]);
    let mut stacked = AdamW::stacked(
        vec![("w".into(), ws.clone()), ("b".into(), bs.clone())],
        AdamWParams::default(),
        &wds,
    )?;
    let mut opts = singles
        .iter()
        .zip(wds)
        .map(|((w, b), wd)| {
            AdamW::new(
                vec![("w".into(), w.clone()), ("b".into(), b.clone())],
                AdamWParams {
                    weight_decay: wd,
                    ..Default::default()
                },
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let c = Tensor::new(&[[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &dev)?;
    let loss = |w: &Tensor, b: &Tensor| -> Result<Tensor> {
        Ok(((w.sqr()?.broadcast_mul(&c))?.sum_all()? + b.powf(3.0)?.sum_all()?)?)
    };
    for _ in 0..4 {
        let grads = loss(ws.as_tensor(), bs.as_tensor())?.backward()?;
        assert!(stacked.step_each(&grads, &lrs)?.is_empty());
        for (((w, b), opt), lr) in singles.iter().zip(&mut opts).zip(lrs) {
            let grads = loss(w.as_tensor(), b.as_tensor())?.backward()?;
            opt.step(&grads, lr)?;
        }
    }
    for (i, (w, b)) in singles.iter().enumerate() {
        let flat = |t: &Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
        assert_eq!(flat(&ws.as_tensor().get(i)?), flat(w.as_tensor()));
        assert_eq!(flat(&bs.as_tensor().get(i)?), flat(b.as_tensor()));
        let (mine, step) = stacked.state_of(i)?;
        let (theirs, _) = opts[i].state()?;
        assert_eq!(step, 4);
        for (k, t) in &theirs {
            assert_eq!(mine[k].dims(), t.dims(), "{k}");
            assert_eq!(flat(&mine[k]), flat(t), "{k}");
        }
    }
    // Restore the rows from the single states, in the other order, and read them back.
    let (s0, _) = opts[0].state()?;
    let (s1, _) = opts[1].state()?;
    stacked.load_states(&[&s1, &s0], 4)?;
    let (back, _) = stacked.state_of(0)?;
    assert_eq!(
        back["v.w"].flatten_all()?.to_vec1::<f32>()?,
        s1["v.w"].flatten_all()?.to_vec1::<f32>()?
    );
    assert!(stacked.load_states(&[&s0], 4).is_err());
    assert!(stacked
        .step_each(&loss(ws.as_tensor(), bs.as_tensor())?.backward()?, &[0.1])
        .is_err());
    assert!(AdamW::stacked(vec![("w".into(), ws)], AdamWParams::default(), &[0.1; 3]).is_err());
    Ok(())
}
