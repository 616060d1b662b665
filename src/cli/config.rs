//! `counterd config`: the effective settings (the URI's password redacted) and where each came
//! from; `--check` only validates them. Neither contacts MongoDB. The text form is itself a
//! valid settings file.

use std::process::ExitCode;

use serde_json::json;

use crate::cli::output::print_json;
use crate::config::Loaded;
use crate::outln;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only validate the settings (file, environment, flags) and say so; exit 2 if invalid.
    #[arg(long)]
    pub check: bool,
    /// Print JSON instead of TOML.
    #[arg(long)]
    pub json: bool,
    /// List every collection counterd writes for these settings (counters, dirty sets,
    /// ledgers, checkpoints, carried batches, leases, runs, sweeps, of every source), with a
    /// mongosh line that drops them all (for an uninstall).
    #[arg(long, conflicts_with = "check")]
    pub collections: bool,
}

pub async fn run(loaded: Loaded, args: Args) -> anyhow::Result<ExitCode> {
    // Invalid settings never get here: loading failed with exit code 2 and named the setting.
    if args.collections {
        return print_collections(&loaded.settings, args.json);
    }
    let redacted = loaded.settings.redacted();
    let table = as_table(&redacted)?;
    // Given (in the file, the environment or a flag) is not the same as changed: a file that
    // spells out defaults gives settings that still equal them.
    let defaults = as_table(&crate::config::Settings::default().redacted())?;
    let given = loaded
        .origins
        .values()
        .filter(|o| o.as_str() != "default")
        .count();
    let changed = table
        .iter()
        .filter(|(name, value)| defaults.get(name.as_str()) != Some(value))
        .count();
    if args.check {
        if args.json {
            print_json(&json!({
                "valid": true,
                "settings": table.len(),
                "given": given,
                "not_default": changed,
                "ignored_environment": loaded.ignored_env,
            }))?;
        } else {
            outln!(
                "configuration OK: {} settings, {given} given, {changed} not at their default; nothing was contacted",
                table.len()
            );
            for variable in &loaded.ignored_env {
                outln!("ignored {variable}: a Kubernetes service link, not a setting");
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.json {
        return print_json(&json!({
            "settings": serde_json::to_value(&redacted)?,
            "definitions": definitions_json(&loaded.settings)?,
            "origins": loaded.origins,
            "ignored_environment": loaded.ignored_env,
        }))
        .map(|_| ExitCode::SUCCESS);
    }
    outln!("# counterd's effective settings; each line says where its value came from.");
    for (name, value) in &table {
        let origin = loaded.origins.get(name).map_or("default", String::as_str);
        // Read from `mongodb_uri_file`: shown, but commented out, so that the output stays a
        // settings file counterd accepts (the two settings exclude each other).
        let from_file = name == "mongodb_uri" && !loaded.settings.mongodb_uri_file.is_empty();
        let comment = if from_file { "# " } else { "" };
        outln!("{comment}{name} = {value}  # {origin}");
    }
    for variable in &loaded.ignored_env {
        outln!("# ignored {variable}: a Kubernetes service link, not a setting");
    }
    outln!("# counter definitions (`--counter NAME`; the first is the default), by source:");
    for source in loaded.settings.sources()? {
        outln!(
            "# source `{}` (collection `{}`):",
            source.stream_name,
            source.comments_collection
        );
        for (_, definition) in source.definitions()?.iter() {
            outln!("#   {definition}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Settings as a TOML table, by setting name: through TOML text, where a condition's date
/// stays a date (`toml::Value::try_from` would give toml's private stand-in for it).
fn as_table(settings: &impl serde::Serialize) -> anyhow::Result<toml::Table> {
    Ok(toml::from_str(&toml::to_string(settings)?)?)
}

/// The definitions as JSON: name, source, group field, condition (as the filter the count
/// queries use, in relaxed extended JSON) and collection, the default first.
fn definitions_json(settings: &crate::config::Settings) -> anyhow::Result<serde_json::Value> {
    let mut list = Vec::new();
    for source in settings.sources()? {
        list.extend(source.definitions()?.iter().map(|(_, d)| {
            json!({
                "name": d.name,
                "source": source.stream_name,
                "source_collection": source.comments_collection,
                "group_field": d.group,
                "condition": bson::Bson::Document(d.condition.to_filter()).into_relaxed_extjson(),
                "collection": d.collection,
                "kind": <&str>::from(&d.kind),
                "sum_of": d.kind.field(),
            })
        }));
    }
    Ok(serde_json::Value::Array(list))
}

/// `--collections`: one line per collection (name, source, what it holds), then the mongosh
/// line that drops them all.
fn print_collections(settings: &crate::config::Settings, json: bool) -> anyhow::Result<ExitCode> {
    let owned = crate::cli::collections::owned(settings)?;
    if json {
        print_json(&json!({"database": settings.database, "collections": owned}))?;
        return Ok(ExitCode::SUCCESS);
    }
    let width = owned.iter().map(|o| o.name.len()).max().unwrap_or(0);
    outln!(
        "# {} collections counterd writes in database `{}` (source, what it holds):",
        owned.len(),
        settings.database
    );
    for o in &owned {
        outln!("{:width$}  {:10} {}", o.name, o.source, o.holds);
    }
    outln!("# to drop them all (uninstall), in mongosh:");
    outln!(
        "# {}",
        crate::cli::collections::drop_command(&settings.database, &owned)
    );
    Ok(ExitCode::SUCCESS)
}
