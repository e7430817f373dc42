//! Tests of the site specs: parsing, resolution on hand-made token spans, errors.

use super::*;

#[test]
fn sites_resolve_to_the_positions_computed_by_hand() {
    // roles:  sep  in   sep  out  sep  in   sep  out  sep  qin  sep
    // tokens:  1    2    1    3    2    1    1    2    2    2    1   (after a BOS at 0)
    // spans:  1..2 2..4 4..5 5..8 8..10 10..11 11..12 12..14 14..16 16..18 18..19
    let roles = [
        "separator",
        "demo_input",
        "separator",
        "demo_output",
        "separator",
        "demo_input",
        "separator",
        "demo_output",
        "separator",
        "query_input",
        "separator",
    ];
    let p = prompt_of_roles(&roles);
    let s = spans(1, &[1, 2, 1, 3, 2, 1, 1, 2, 2, 2, 1]);
    assert_eq!(s[0], 1..2);
    assert_eq!(s[3], 5..8);
    assert_eq!(s[10], 18..19);
    let n = 19;
    let r = |spec: &str| {
        SiteSpec::parse(spec)
            .unwrap()
            .resolve(0, &p, &s, n)
            .unwrap()
    };
    assert_eq!(
        r("query: last; keys: demo_output, query_input"),
        (vec![18], vec![7, 13, 17])
    );
    assert_eq!(
        r("keys: demo_output[0]; query: last"),
        (vec![18], vec![5, 12])
    );
    assert_eq!(
        r("query: demo_output[1]; keys: demo_output[-2]"),
        (vec![6, 13], vec![6, 12])
    );
    assert_eq!(
        r("query: demo_output#0; keys: demo_output#-1"),
        (vec![7], vec![13])
    );
    assert_eq!(
        r("query: demo_output#1[0]; keys: demo_output#-2[-3]"),
        (vec![12], vec![5])
    );
    assert_eq!(
        r("query: separator#-1, last; keys: separator[0], demo_input#0[-1]"),
        (vec![18, 18], vec![1, 4, 8, 11, 14, 18, 3])
    );
    assert_eq!(
        r(" query :  last ;keys:query_input[ -2 ] "),
        (vec![18], vec![16])
    );
}

fn resolve_err(spec: &str, roles: &[&str], counts: &[usize], n: usize) -> String {
    let p = prompt_of_roles(roles);
    SiteSpec::parse(spec)
        .unwrap()
        .resolve(7, &p, &spans(0, counts), n)
        .unwrap_err()
        .to_string()
}

#[test]
fn site_errors_name_the_prompt_and_the_item() {
    let roles = ["a", "b", "a"];
    let m = resolve_err("query: last; keys: c", &roles, &[1, 1, 1], 3);
    assert_eq!(
        m,
        "invalid input `prompt 7, site `c``: unknown role `c`; the prompt's roles: a, b"
    );
    let m = resolve_err("query: last; keys: b", &roles, &[1, 0, 1], 2);
    assert!(
        m.contains("prompt 7, site `b`") && m.contains("no tokens"),
        "{m}"
    );
    let m = resolve_err("query: a; keys: b", &roles, &[1, 1, 1], 2);
    assert!(
        m.contains("prompt 7, site `a`") && m.contains("past the end"),
        "{m}"
    );
    let m = resolve_err("query: last; keys: a#2", &roles, &[1, 1, 1], 3);
    assert!(
        m.contains("site `a#2`") && m.contains("segment number 2 is out of range"),
        "{m}"
    );
    let m = resolve_err("query: last; keys: a#-3", &roles, &[1, 1, 1], 3);
    assert!(m.contains("site `a#-3`"), "{m}");
    let m = resolve_err("query: last; keys: b[2]", &roles, &[1, 2, 1], 4);
    assert!(
        m.contains("site `b[2]`") && m.contains("token index 2 is out of range"),
        "{m}"
    );
    let m = resolve_err("query: last; keys: b[-3]", &roles, &[1, 2, 1], 4);
    assert!(m.contains("site `b[-3]`"), "{m}");
    // `a#-2` is the first `a` (in range) and `b[-2]` its first token.
    let p = prompt_of_roles(&roles);
    let ok = SiteSpec::parse("query: a#-2; keys: b[-2]")
        .unwrap()
        .resolve(0, &p, &spans(0, &[1, 2, 1]), 4)
        .unwrap();
    assert_eq!(ok, (vec![0], vec![1]));
    // Spans not one per segment.
    let e = SiteSpec::parse("query: last; keys: a")
        .unwrap()
        .resolve(3, &p, &spans(0, &[1, 1]), 2)
        .unwrap_err();
    assert!(e.to_string().contains("prompt 3"), "{e}");
}

#[test]
fn site_specs_parse_display_and_refuse_bad_text() {
    let s = SiteSpec::parse("keys:demo_output , query_input#-1[0];query:last").unwrap();
    assert_eq!(
        s.to_string(),
        "query: last; keys: demo_output, query_input#-1[0]"
    );
    assert_eq!(SiteSpec::parse(&s.to_string()).unwrap(), s);
    assert_eq!(
        "query: last; keys: key"
            .parse::<SiteSpec>()
            .unwrap()
            .to_string(),
        "query: last; keys: key"
    );
    for (bad, needle) in [
        ("query: last", "no `keys:`"),
        ("keys: a", "no `query:`"),
        ("query: last; keys: a; query: b", "twice"),
        ("query: last; key: a", "unknown section `key`"),
        ("query: last; keys: a,,b", "empty item"),
        ("query: last; keys: a#x", "segment number `x`"),
        ("query: last; keys: a[1", "`[` without"),
        ("query: last; keys: a[z]", "token index `z`"),
        ("query: last; keys: #1", "names no role"),
        ("query: last; keys: a b", "contains ` `"),
        ("query last; keys: a", "lacks `query:`"),
    ] {
        let e = SiteSpec::parse(bad).unwrap_err().to_string();
        assert!(e.contains(needle) && e.contains(bad), "{bad}: {e}");
    }
}

#[test]
fn a_set_must_give_the_same_numbers_of_sites_everywhere() {
    let p0 = prompt_of_roles(&["x", "k", "k", "q"]);
    let p1 = prompt_of_roles(&["k", "x", "k", "q"]);
    let p2 = prompt_of_roles(&["k", "q", "k", "k", "q"]);
    let spec = SiteSpec::parse("query: q; keys: k").unwrap();
    let set = PromptSet::new(vec![p0.clone(), p1.clone()], "t").unwrap();
    let sp = vec![spans(1, &[1, 1, 2, 1]), spans(0, &[2, 1, 1, 1])];
    let r = spec.resolve_set(&set, &sp, &[6, 5]).unwrap();
    assert_eq!(r.query.shape(), [2, 1]);
    assert_eq!(r.query.column(0).to_vec(), [5, 4]);
    assert_eq!(r.keys.row(0).to_vec(), [2, 4]);
    assert_eq!(r.keys.row(1).to_vec(), [1, 3]);
    let set = PromptSet::new(vec![p0, p1, p2], "t").unwrap();
    let sp = vec![
        spans(0, &[1, 1, 1, 1]),
        spans(0, &[1, 1, 1, 1]),
        spans(0, &[1, 1, 1, 1, 1]),
    ];
    let e = spec
        .resolve_set(&set, &sp, &[4, 4, 5])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid input `prompt 2`"), "{e}");
    assert!(
        e.contains("2 query and 3 key") && e.contains("prompt 0 gives 1 and 2"),
        "{e}"
    );
}
