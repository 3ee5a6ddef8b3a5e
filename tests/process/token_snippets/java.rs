//! The Java snippets (examples/tokens/*.java: Curator's `InterProcessMutex`) compiled once with
//! javac against Debian's jars, and the class path they run with.

use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Where Debian installs Java libraries.
const JAVA_LIBRARY: &str = "/usr/share/java";

/// The jars of the Java snippets' class path, in [`JAVA_LIBRARY`]: Curator (Debian's
/// libcurator-recipes-java) with what it needs of ZooKeeper, Guava and SLF4J, and slf4j-simple
/// so that the clients' warnings reach the snippet's stderr (`SLF4J_LEVEL`).
const JAVA_JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-simple",
];

/// What slf4j-simple logs: warnings and errors, not ZooKeeper's every connection step.
pub(super) const SLF4J_LEVEL: &str = "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn";

/// What to run when javac or a jar is missing.
const JAVA_INSTALL: &str =
    "run tests/upstreams/install.sh (it installs a JDK and Debian's libcurator-recipes-java)";

/// The Java snippets' class path: [`JAVA_JARS`] in [`JAVA_LIBRARY`]. Panics, naming the fix, when
/// one is missing.
pub(super) fn java_class_path() -> String {
    let jars: Vec<String> = JAVA_JARS
        .iter()
        .map(|jar| format!("{JAVA_LIBRARY}/{jar}.jar"))
        .collect();
    let missing: Vec<&String> = jars
        .iter()
        .filter(|jar| !Path::new(jar).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "the Java snippets need {missing:?}; {JAVA_INSTALL}"
    );
    jars.join(":")
}

/// The directory of the Java snippets' classes (`examples/tokens/*.java`), compiled with javac
/// once per version of their sources and class path, into `CARGO_TARGET_TMPDIR`: in a directory
/// of its own first, then renamed into place, so that test processes running at once never see
/// half-written classes. Panics, naming the fix, when javac or a jar is missing, or javac fails.
pub(super) fn compiled_java_snippets() -> &'static Path {
    static CLASSES: OnceLock<PathBuf> = OnceLock::new();
    CLASSES.get_or_init(|| {
        // Checked even when the classes are there: java comes with javac.
        let javac = Command::new("javac")
            .arg("-version")
            .output()
            .unwrap_or_else(|e| panic!("javac could not be run ({e}); {JAVA_INSTALL}"));
        assert!(
            javac.status.success(),
            "javac -version failed; {JAVA_INSTALL}"
        );
        let class_path = java_class_path();
        let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/tokens");
        let mut sources: Vec<PathBuf> = std::fs::read_dir(&examples)
            .unwrap_or_else(|e| panic!("listing {}: {e}", examples.display()))
            .map(|entry| entry.expect("an entry of examples/tokens").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "java"))
            .collect();
        sources.sort();
        let mut version = std::collections::hash_map::DefaultHasher::new();
        class_path.hash(&mut version);
        for source in &sources {
            std::fs::read(source)
                .unwrap_or_else(|e| panic!("reading {}: {e}", source.display()))
                .hash(&mut version);
        }
        let target_tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let classes = target_tmp.join(format!("token-snippets-java-{:016x}", version.finish()));
        if classes.is_dir() {
            return classes;
        }
        let staging = tempfile::tempdir_in(target_tmp).expect("a directory for javac's classes");
        let compiled = Command::new("javac")
            .arg("-d")
            .arg(staging.path())
            .args(["-cp", &class_path])
            .args(&sources)
            .output()
            .unwrap_or_else(|e| panic!("javac could not be run ({e}); {JAVA_INSTALL}"));
        assert!(
            compiled.status.success(),
            "javac {sources:?} failed ({}):\n{}{}",
            compiled.status,
            String::from_utf8_lossy(&compiled.stdout),
            String::from_utf8_lossy(&compiled.stderr)
        );
        // Another process may have put the same classes there first: theirs serve as well.
        if let Err(e) = std::fs::rename(staging.path(), &classes) {
            assert!(
                classes.is_dir(),
                "moving the classes to {}: {e}",
                classes.display()
            );
        }
        classes
    })
}
