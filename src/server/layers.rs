//! The server's layers and the one direction they depend in, held by a
//! test: `http` and `bedrock` over `queue`, `queue` over `store`, and
//! `ledger` (the model of the ledger's rows: attempts, statistics,
//! supervisors, failure groups) under both, beside `protocol`. The queue
//! writes the ledger through its own `queue::record`; the store reads and
//! writes the ledger's rows. So no layer imports one above it, and there is
//! no import circle.

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The `.rs` files under `dir`, its subdirectories' included.
    fn sources(dir: &Path, into: &mut Vec<std::path::PathBuf>) {
        for entry in
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, into);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                into.push(path);
            }
        }
    }

    /// Every other layer `crate::server::X` that the non-test code of a
    /// module's files names (a module may name its own paths).
    fn imports(module: &str) -> Vec<(String, String)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/server")
            .join(module);
        let mut found = Vec::new();
        let mut files = Vec::new();
        sources(&dir, &mut files);
        files.sort();
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            // Test code (a trailing `mod tests`, or a file of tests) may
            // reach any layer to set a case up.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for layer in ["http", "bedrock", "queue", "store", "ledger"] {
                if layer != module && code.contains(&format!("crate::server::{layer}")) {
                    found.push((path.display().to_string(), layer.to_string()));
                }
            }
        }
        found
    }

    #[test]
    fn the_ledger_imports_no_other_layer_of_the_server() {
        assert_eq!(imports("ledger"), Vec::<(String, String)>::new());
    }

    #[test]
    fn the_store_imports_only_the_ledger() {
        let above: Vec<_> = imports("store")
            .into_iter()
            .filter(|(_, layer)| layer != "ledger")
            .collect();
        assert_eq!(above, Vec::<(String, String)>::new());
    }

    #[test]
    fn the_queue_imports_no_layer_above_it() {
        let above: Vec<_> = imports("queue")
            .into_iter()
            .filter(|(_, layer)| layer == "http" || layer == "bedrock")
            .collect();
        assert_eq!(above, Vec::<(String, String)>::new());
    }
}
