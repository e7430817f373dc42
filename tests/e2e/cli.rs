//! The binary itself: its subcommands, `--version`, and usage errors before any subcommand runs.

use crate::util::hyperlens;

/// The fourteen subcommands, in the order of `--help`.
const SUBCOMMANDS: [&str; 14] = [
    "tasks",
    "import",
    "info",
    "eval",
    "train",
    "probe",
    "report",
    "study",
    "analyze",
    "attention",
    "circuits",
    "cache",
    "patch",
    "sweep",
];

#[test]
fn help_lists_every_subcommand_and_version_is_the_crates() {
    let help = hyperlens(&["--help"]);
    let text = help.success();
    let listed: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert_eq!(listed, SUBCOMMANDS, "{text}");
    let version = hyperlens(&["--version"]);
    assert_eq!(
        version.success().trim(),
        format!("hyperlens {}", env!("CARGO_PKG_VERSION"))
    );
    // Every subcommand has its own help, which exits 0.
    for c in SUBCOMMANDS {
        let h = hyperlens(&[c, "--help"]);
        assert!(
            h.success().contains("Usage: hyperlens "),
            "{c}: {}",
            h.stdout
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    // No subcommand: clap prints the help on stderr and exits 2.
    let r = hyperlens::<&str>(&[]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stderr.contains("Usage: hyperlens [OPTIONS] <COMMAND>"),
        "{r:?}"
    );
    hyperlens(&["nope"]).usage_error(&["unrecognized subcommand 'nope'"]);
    hyperlens(&["--nope"]).usage_error(&["unexpected argument '--nope'"]);
}
