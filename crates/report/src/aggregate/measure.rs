//! The aggregate's measurement: each run's key and metrics, and the groups with their mean ±
//! s.e. and n.

use std::fmt::Write as _;
use std::path::Path;

use hyperlens_model::{Mixer, RunRecord, Task};
use hyperlens_train::TrainSettings;

use crate::aggregate::text::num;
use crate::data::{Aggregate, Entry, Group, LogicEntry, RunPoint};

/// Settings that do not define a group: the seed and split (what varies between seeds) and the
/// bookkeeping of evaluation, checkpoints and logs.
const NOT_IN_KEY: [&str; 7] = [
    "seed",
    "split",
    "eval_every",
    "eval_n",
    "eval_seed",
    "checkpoint_every",
    "log_every",
];

/// The text of a JSON scalar for a key.
fn value_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), num),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The fields of a run's settings that define its group, as `train`'s flag names with `_`, in a
/// fixed order: `source=hyperlens` (imported checkpoints have `source=imported`), the common ones,
/// then those of its task.
pub fn key_fields(s: &TrainSettings) -> Vec<(String, String)> {
    let Ok(serde_json::Value::Object(map)) = serde_json::to_value(s) else {
        return Vec::new();
    };
    let mut out = vec![("source".to_string(), "hyperlens".to_string())];
    for (k, v) in &map {
        if NOT_IN_KEY.contains(&k.as_str()) || v.is_object() {
            continue;
        }
        if k == "size" && v.is_null() {
            continue;
        }
        out.push((k.clone(), value_text(v)));
    }
    // The sizes of the run's task: the settings' object named after it.
    let nested: &[(&str, &str)] = match s.task {
        Task::Sraven => &[
            ("features", "features"),
            ("values", "values"),
            ("holdout_fraction", "holdout"),
        ],
        Task::Logic => &[
            ("variables", "logic_variables"),
            ("terms", "logic_terms"),
            ("unknown_fraction", "logic_unknown_fraction"),
            ("frac_test", "logic_frac_test"),
            ("samples", "logic_samples"),
        ],
        Task::Induction => &[],
    };
    if let Some(serde_json::Value::Object(sub)) = map.get(s.task.name()) {
        for (field, name) in nested {
            if let Some(v) = sub.get(*field) {
                out.push(((*name).to_string(), value_text(v)));
            }
        }
    }
    out
}

/// The metrics of a task, in column order: SRAVEN `id_acc`, `ood_acc`, then the OOD rule
/// decoding accuracy per layer `decoding_layer{l}` and `decoding_all`; logic `id_r2`, `ood_r2`,
/// `unknown_r2`, then the term F1 per layer `term_f1_layer{l}` and `term_f1_all`.
pub fn metric_names(task: Task, n_layers: usize) -> Vec<String> {
    let (base, layer): (&[&str], &str) = match task {
        Task::Logic => (&["id_r2", "ood_r2", "unknown_r2"], "term_f1"),
        Task::Sraven | Task::Induction => (&["id_acc", "ood_acc"], "decoding"),
    };
    let mut v: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    v.extend((0..n_layers).map(|l| format!("{layer}_layer{l}")));
    v.push(format!("{layer}_all"));
    v
}

/// The key of a checkpoint without training settings: its mixer, `source=imported`, and who
/// trained it.
fn imported_key(dir: &Path, mixer: Mixer, task: Task) -> Vec<(String, String)> {
    vec![
        ("task".into(), task.to_string()),
        ("mixer".into(), mixer.to_string()),
        ("source".into(), "imported".into()),
        (
            "trained_by".into(),
            RunRecord::read(dir)
                .ok()
                .and_then(|r| r.trained_by)
                .unwrap_or_else(|| "unknown".into()),
        ),
    ]
}

/// The [`RunPoint`]s of the report's checkpoints.
pub fn points(entries: &[Entry], logic: &[LogicEntry]) -> Vec<RunPoint> {
    let mut out = Vec::new();
    for e in entries {
        let settings = hyperlens_train::run_settings(&e.dir).ok();
        let mut metrics = vec![
            ("id_acc".to_string(), e.id.accuracy),
            ("ood_acc".to_string(), e.ood.accuracy),
        ];
        for a in &e.latent.layers {
            let name = match a.layer.index() {
                Some(l) => format!("decoding_layer{l}"),
                None => "decoding_all".into(),
            };
            metrics.push((name, a.decoding.accuracy));
        }
        out.push(RunPoint {
            name: e.name.clone(),
            task: Task::Sraven,
            key: settings
                .as_ref()
                .map_or_else(|| imported_key(&e.dir, e.mixer, Task::Sraven), key_fields),
            seed: settings.map(|s| s.seed),
            metrics,
        });
    }
    for e in logic {
        let settings = hyperlens_train::run_settings(&e.dir).ok();
        let mut metrics: Vec<(String, f64)> = ["id", "ood", "unknown"]
            .iter()
            .filter_map(|s| e.r2(s).map(|v| (format!("{s}_r2"), v)))
            .collect();
        for r in &e.decoding {
            let name = match r.layer {
                Some(l) => format!("term_f1_layer{l}"),
                None => "term_f1_all".into(),
            };
            metrics.push((name, r.f1_mean));
        }
        out.push(RunPoint {
            name: e.name.clone(),
            task: Task::Logic,
            key: settings
                .as_ref()
                .map_or_else(|| imported_key(&e.dir, e.mixer, Task::Logic), key_fields),
            seed: settings.map(|s| s.seed),
            metrics,
        });
    }
    out
}

/// Mean, standard error (sample standard deviation / √n; NaN for n < 2) and n of the finite
/// values.
pub fn mean_se(values: &[f64]) -> (f64, f64, usize) {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let n = v.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, 0);
    }
    let mean = v.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, f64::NAN, n);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, (var / n as f64).sqrt(), n)
}

impl Aggregate {
    /// Groups `points` (module docs).
    pub fn new(points: Vec<RunPoint>) -> Aggregate {
        let mut groups: Vec<Group> = Vec::new();
        for (i, p) in points.iter().enumerate() {
            match groups
                .iter_mut()
                .find(|g| g.task == p.task && g.key == p.key)
            {
                Some(g) => g.runs.push(i),
                None => groups.push(Group {
                    task: p.task,
                    key: p.key.clone(),
                    label: String::new(),
                    runs: vec![i],
                    stats: Vec::new(),
                }),
            }
        }
        let mut axes = Vec::new();
        for task in [Task::Sraven, Task::Logic] {
            let of_task: Vec<&Group> = groups.iter().filter(|g| g.task == task).collect();
            if of_task.is_empty() {
                continue;
            }
            // A setting varies when the groups that have it disagree on it (a setting only some
            // groups have, such as an imported checkpoint's `trained_by`, does not vary by that).
            let mut varying: Vec<String> = Vec::new();
            for g in &of_task {
                for (k, v) in &g.key {
                    if !varying.contains(k)
                        && of_task
                            .iter()
                            .any(|o| o.setting(k).is_some_and(|w| w != v.as_str()))
                    {
                        varying.push(k.clone());
                    }
                }
            }
            // Mixer first: it is the series of the figures.
            varying.sort_by_key(|k| k != "mixer");
            axes.push((task, varying));
        }
        for g in &mut groups {
            let varying = axes
                .iter()
                .find(|(t, _)| *t == g.task)
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let parts: Vec<String> = varying
                .iter()
                .filter_map(|k| g.setting(k).map(|v| format!("{k}={v}")))
                .collect();
            g.label = if parts.is_empty() {
                format!("mixer={}", g.setting("mixer").unwrap_or("?"))
            } else {
                parts.join(", ")
            };
            let n_layers = g
                .runs
                .iter()
                .flat_map(|&i| points[i].metrics.iter())
                .filter_map(|(m, _)| {
                    m.rsplit_once("_layer")
                        .and_then(|(_, l)| l.parse::<usize>().ok())
                })
                .max()
                .map_or(0, |l| l + 1);
            g.stats = metric_names(g.task, n_layers)
                .into_iter()
                .map(|m| {
                    let vals: Vec<f64> = g
                        .runs
                        .iter()
                        .filter_map(|&i| {
                            points[i]
                                .metrics
                                .iter()
                                .find(|(n, _)| *n == m)
                                .map(|(_, v)| *v)
                        })
                        .collect();
                    let (mean, se, n) = mean_se(&vals);
                    (m, mean, se, n)
                })
                .collect();
        }
        Aggregate {
            points,
            groups,
            axes,
        }
    }

    /// Whether any group holds more than one run (the aggregate then has something to say).
    pub fn has_replicates(&self) -> bool {
        self.groups.iter().any(|g| g.runs.len() > 1)
    }

    /// `aggregate.csv`: one row per group; columns `task`, `group`, the varying settings (empty
    /// where a task does not have them), `n` (runs), `runs` (their names, `;`-separated), then
    /// `<metric>_mean`, `<metric>_se` and `<metric>_n` for every metric of either task (empty
    /// where the group's task has no such metric; `se` empty for a single run).
    pub fn csv(&self) -> String {
        let mut settings: Vec<String> = Vec::new();
        for (_, v) in &self.axes {
            for k in v {
                if !settings.contains(k) {
                    settings.push(k.clone());
                }
            }
        }
        let mut metrics: Vec<String> = Vec::new();
        for g in &self.groups {
            for (m, ..) in &g.stats {
                if !metrics.contains(m) {
                    metrics.push(m.clone());
                }
            }
        }
        let mut s = String::from("task,group");
        for k in &settings {
            let _ = write!(s, ",{k}");
        }
        s.push_str(",n,runs");
        for m in &metrics {
            let _ = write!(s, ",{m}_mean,{m}_se,{m}_n");
        }
        s.push('\n');
        let cell = |v: f64| {
            if v.is_finite() {
                format!("{v:.6}")
            } else {
                String::new()
            }
        };
        for g in &self.groups {
            let _ = write!(s, "{},\"{}\"", g.task, g.label.replace('"', "'"));
            for k in &settings {
                let _ = write!(s, ",{}", g.setting(k).unwrap_or(""));
            }
            let names: Vec<&str> = g
                .runs
                .iter()
                .map(|&i| self.points[i].name.as_str())
                .collect();
            let _ = write!(s, ",{},{}", g.runs.len(), names.join(";"));
            for m in &metrics {
                match g.stat(m) {
                    Some((mean, se, n)) => {
                        let _ = write!(s, ",{},{},{n}", cell(mean), cell(se));
                    }
                    None => s.push_str(",,,"),
                }
            }
            s.push('\n');
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(name: &str, task: Task, mixer: &str, steps: &str, seed: u64, ood: f64) -> RunPoint {
        RunPoint {
            name: name.into(),
            task,
            key: vec![
                ("task".into(), task.to_string()),
                ("mixer".into(), mixer.to_string()),
                ("steps".into(), steps.into()),
            ],
            seed: Some(seed),
            metrics: vec![
                ("id_acc".into(), ood + 0.1),
                ("ood_acc".into(), ood),
                ("decoding_layer0".into(), 0.5),
                ("decoding_all".into(), 0.6),
            ],
        }
    }

    #[test]
    fn mean_and_standard_error_match_hand_values() {
        // 0.5, 0.6, 0.7: mean 0.6, sample sd 0.1, se 0.1 / sqrt(3).
        let (m, s, n) = mean_se(&[0.5, 0.6, 0.7, f64::NAN]);
        assert!((m - 0.6).abs() < 1e-12 && (s - 0.1 / 3f64.sqrt()).abs() < 1e-12 && n == 3);
        let (m, s, n) = mean_se(&[0.4]);
        assert!(m == 0.4 && s.is_nan() && n == 1);
        assert_eq!(mean_se(&[]).2, 0);
    }

    #[test]
    fn runs_group_by_everything_but_the_seed() {
        let agg = Aggregate::new(vec![
            point("a0", Task::Sraven, "hyla", "40", 0, 0.5),
            point("a1", Task::Sraven, "hyla", "40", 1, 0.7),
            point("b0", Task::Sraven, "softmax", "40", 0, 0.2),
            point("c0", Task::Sraven, "hyla", "80", 0, 0.9),
        ]);
        assert_eq!(agg.groups.len(), 3);
        assert_eq!(
            agg.axes,
            [(Task::Sraven, vec!["mixer".to_string(), "steps".to_string()])]
        );
        let g = &agg.groups[0];
        assert_eq!(g.label, "mixer=hyla, steps=40");
        let (m, s, n) = g.stat("ood_acc").unwrap();
        assert!((m - 0.6).abs() < 1e-12 && (s - 0.1).abs() < 1e-12 && n == 2);
        assert!(agg.has_replicates());
        let csv = agg.csv();
        let mut lines = csv.lines();
        assert_eq!(
            lines.next().unwrap(),
            "task,group,mixer,steps,n,runs,id_acc_mean,id_acc_se,id_acc_n,ood_acc_mean,ood_acc_se,ood_acc_n,decoding_layer0_mean,decoding_layer0_se,decoding_layer0_n,decoding_all_mean,decoding_all_se,decoding_all_n"
        );
        assert!(lines.next().unwrap().starts_with("sraven,\"mixer=hyla, steps=40\",hyla,40,2,a0;a1,0.700000,0.100000,2,0.600000,0.100000,2"));
        assert!(lines
            .next()
            .unwrap()
            .contains(",1,b0,0.300000,,1,0.200000,,1"));
    }

    #[test]
    fn settings_only_some_groups_have_do_not_label_them() {
        let key = |mixer: &str, source: &str, extra: Option<(&str, &str)>| {
            let mut k = vec![
                ("task".to_string(), "sraven".to_string()),
                ("mixer".to_string(), mixer.to_string()),
                ("source".to_string(), source.to_string()),
            ];
            if let Some((a, b)) = extra {
                k.push((a.to_string(), b.to_string()));
            }
            k
        };
        let p = |name: &str, k: Vec<(String, String)>| RunPoint {
            name: name.into(),
            task: Task::Sraven,
            key: k,
            seed: None,
            metrics: vec![("ood_acc".into(), 0.5)],
        };
        let agg = Aggregate::new(vec![
            p(
                "jax-hyla",
                key("hyla", "imported", Some(("trained_by", "JAX"))),
            ),
            p("hl-hyla", key("hyla", "hyperlens", Some(("steps", "100")))),
            p(
                "hl-softmax",
                key("softmax", "hyperlens", Some(("steps", "100"))),
            ),
        ]);
        let labels: Vec<&str> = agg.groups.iter().map(|g| g.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "mixer=hyla, source=imported",
                "mixer=hyla, source=hyperlens",
                "mixer=softmax, source=hyperlens"
            ]
        );
        assert!(!agg.has_replicates());
    }
}
