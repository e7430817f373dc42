//! `hyperlens info`: the tensor table against statistics computed here from `model.safetensors`, and
//! the errors for missing or inconsistent checkpoint files.

use hyperlens_model::Mixer;

use crate::util::{
    close, hyperlens, json, s, safetensors, sraven_checkpoint, tempdir, tiny_config, values,
};

#[test]
fn info_describes_every_tensor() {
    let tmp = tempdir();
    let ckpt = tmp.path().join("tiny");
    sraven_checkpoint(&ckpt, Mixer::Hyla, 5);
    let r = hyperlens(&["info", "--checkpoint", s(&ckpt), "--json"]);
    let v: serde_json::Value = serde_json::from_str(r.success()).unwrap();
    assert_eq!(v["config"], json(&ckpt.join("config.json")));
    assert_eq!(v["config"]["mixer"], "hyla");
    assert_eq!(v["normalisation"], "rms_head");
    let weights = safetensors(&ckpt.join("model.safetensors"));
    let rows = v["tensors"].as_array().unwrap();
    assert_eq!(rows.len(), weights.len());
    let mut total = 0;
    for row in rows {
        let name = row["name"].as_str().unwrap();
        let (shape, x) = values(&weights[name]);
        assert_eq!(row["shape"], serde_json::json!(shape), "{name}");
        assert_eq!(row["numel"].as_u64(), Some(x.len() as u64), "{name}");
        let n = x.len() as f64;
        let mean = x.iter().sum::<f64>() / n;
        let std = (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        let max_abs = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        close(
            &format!("{name} mean"),
            row["mean"].as_f64().unwrap(),
            mean,
            1e-9,
        );
        close(
            &format!("{name} std"),
            row["std"].as_f64().unwrap(),
            std,
            1e-9,
        );
        close(
            &format!("{name} max"),
            row["max_abs"].as_f64().unwrap(),
            max_abs,
            1e-9,
        );
        total += x.len();
    }
    assert_eq!(v["n_params"].as_u64(), Some(total as u64));
    assert_eq!(total, tiny_config(Mixer::Hyla).n_params());

    // The text form: the mixer, the sizes, the count, and one row per tensor in the same order.
    let text = hyperlens(&["info", "--checkpoint", s(&ckpt)])
        .success()
        .to_string();
    assert!(
        text.contains("mixer        hyla (paper: linear_hypatt;"),
        "{text}"
    );
    assert!(
        text.contains("D 12, H 3, d 4, layers 2, D_mlp 16"),
        "{text}"
    );
    assert!(text.contains(&format!("parameters   {total}\n")), "{text}");
    let listed: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("tensor "))
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(listed, names);
}

#[test]
fn info_failures_name_the_file_and_tensor() {
    let tmp = tempdir();
    let missing = tmp.path().join("nope");
    hyperlens(&["info", "--checkpoint", s(&missing)])
        .failure(&[&format!("{}/config.json", s(&missing))]);
    let ckpt = tmp.path().join("tiny");
    sraven_checkpoint(&ckpt, Mixer::Softmax, 1);
    let config = ckpt.join("config.json");
    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, "{ not json").unwrap();
    hyperlens(&["info", "--checkpoint", s(&ckpt)]).failure(&[s(&config), "line 1"]);
    // A config that disagrees with the weights: the tensor and both shapes are named.
    std::fs::write(&config, good.replace("\"d_model\": 12", "\"d_model\": 16")).unwrap();
    hyperlens(&["info", "--checkpoint", s(&ckpt)]).failure(&[
        "model.safetensors",
        "embed.W_E",
        "[8, 12]",
        "[8, 16]",
    ]);
    std::fs::write(&config, &good).unwrap();
    std::fs::remove_file(ckpt.join("model.safetensors")).unwrap();
    hyperlens(&["info", "--checkpoint", s(&ckpt)]).failure(&["model.safetensors"]);
}

#[test]
fn info_usage_errors() {
    hyperlens(&["info"]).usage_error(&["--checkpoint <CHECKPOINT>"]);
    hyperlens(&["info", "--checkpoint", "x", "--jsn"])
        .usage_error(&["unexpected argument '--jsn'", "'--json'"]);
}
