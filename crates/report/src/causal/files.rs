//! `tables/causal.csv`.

use crate::data::{frac, Entry};

/// `tables/causal.csv`: `checkpoint,mixer,layer,kind,n,to_donor,elsewhere,unchanged,excluded,frac_to_donor,frac_changed,max_logit_change`.
pub fn csv(entries: &[Entry]) -> String {
    let mut s = String::from(
        "checkpoint,mixer,layer,kind,n,to_donor,elsewhere,unchanged,excluded,frac_to_donor,frac_changed,max_logit_change\n",
    );
    for e in entries {
        let Some(c) = &e.causal else { continue };
        for r in &c.rows {
            s.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{:.6},{:.6},{:e}\n",
                e.name,
                e.mixer,
                r.layer,
                r.kind,
                r.n,
                r.to_donor,
                r.elsewhere,
                r.unchanged,
                r.excluded,
                frac(r.to_donor, r.n),
                frac(r.to_donor + r.elsewhere, r.n),
                r.max_logit_change
            ));
        }
    }
    s
}
