//! `tables/accuracy.csv`.

use std::fmt::Write as _;

use crate::data::Entry;
use crate::sraven::verdict::at_chance;

/// `tables/accuracy.csv`: one row per checkpoint, columns
/// `checkpoint,mixer,split,id_accuracy,ood_accuracy,id_loss,ood_loss,n,steps,planned_steps,at_chance`;
/// `steps` and `planned_steps` (the length of the run's schedule) are empty when not recorded.
pub fn accuracy_csv(entries: &[Entry]) -> String {
    let mut s = String::from(
        "checkpoint,mixer,split,id_accuracy,ood_accuracy,id_loss,ood_loss,n,steps,planned_steps,at_chance\n",
    );
    for e in entries {
        let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        let _ = writeln!(
            s,
            "{},{},{},{:.6},{:.6},{:.6},{:.6},{},{},{},{}",
            e.name,
            e.mixer,
            e.split,
            e.id.accuracy,
            e.ood.accuracy,
            e.id.loss,
            e.ood.loss,
            e.id.n,
            opt(e.steps.map(|s| s.done)),
            opt(e.steps.and_then(|s| s.planned)),
            at_chance(e)
        );
    }
    s
}
