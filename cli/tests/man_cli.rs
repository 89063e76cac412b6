//! `kace generate-man`, the packaging step that writes the man pages from the clap definitions:
//! one page per visible (sub)command, the extra sections in `kace.1`, no page for itself.

use std::fs;

#[test]
fn generate_man_writes_one_page_per_visible_command() {
    let tmp = kace_test_support::TempDir::new("man");
    let dir = tmp.join("man");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kace"))
        .arg("generate-man")
        .arg(&dir)
        .output()
        .expect("kace runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed = String::from_utf8(out.stdout).unwrap();
    for page in ["kace.1", "kace-retrain.1", "kace-profile-import-ncu.1", "kace-db-init.1"] {
        assert!(dir.join(page).is_file(), "no {page}");
        assert!(listed.contains(page), "{page} not listed: {listed}");
    }
    assert!(!dir.join("kace-generate-man.1").exists(), "the hidden command got a page");
    let top = fs::read_to_string(dir.join("kace.1")).unwrap();
    for section in [".SH NAME", ".SH SUBCOMMANDS", ".SH FILES", ".SH EXIT STATUS", ".SH VERSION"] {
        assert!(top.contains(section), "kace.1 has no {section}");
    }
    let retrain = fs::read_to_string(dir.join("kace-retrain.1")).unwrap();
    assert!(retrain.contains("keep\\-days"), "kace-retrain.1 lacks --keep-days");
}
