//! `jobmgr completions SHELL`, `jobmgr man` and `jobmgr bwm-php-runner`:
//! shell completions and the man page, generated from the command-line
//! definition, and the PHP runner (packages install all three).

use clap::{Args, CommandFactory};

/// Options of `jobmgr completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Prints the completion script for `shell` on stdout.
pub fn completions(args: CompletionsArgs) -> Result<(), super::CliError> {
    let mut command = super::Cli::command();
    clap_complete::generate(args.shell, &mut command, "jobmgr", &mut std::io::stdout());
    Ok(())
}

/// Prints the man page `jobmgr(1)`, in roff, on stdout: the supervisor's
/// options, then each subcommand's, then FILES, ENVIRONMENT, SIGNALS, EXIT
/// STATUS and THE WORKER CONTRACT.
pub fn man() -> Result<(), super::CliError> {
    let command = super::Cli::command();
    let mut out = Vec::new();
    let write = |error: std::io::Error| {
        super::CliError::Usage(format!("cannot write the man page: {error}"))
    };
    clap_mangen::Man::new(command.clone())
        .render(&mut out)
        .map_err(write)?;
    for sub in command
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let name = format!("jobmgr {}", sub.get_name());
        let man = clap_mangen::Man::new(sub.clone().bin_name(name.clone()));
        out.extend_from_slice(format!(".SH \"{}\"\n", name.to_uppercase()).as_bytes());
        man.render_synopsis_section(&mut out).map_err(write)?;
        man.render_description_section(&mut out).map_err(write)?;
        man.render_options_section(&mut out).map_err(write)?;
    }
    out.extend_from_slice(super::man::sections().as_bytes());
    use std::io::Write;
    std::io::stdout().write_all(&out).map_err(write)
}

/// Prints `text` to stdout as it is (`jobmgr bwm-php-runner`).
pub fn print(text: &str) -> Result<(), super::CliError> {
    use std::io::Write;
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| super::CliError::Usage(format!("cannot write to stdout: {e}")))
}
