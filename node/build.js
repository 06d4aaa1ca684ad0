#!/usr/bin/env node
// Builds the native addon from source and puts it at ./tether.node.
//
// Run by npm as the package's `install` script (also for `npm install
// ./node`, which links the folder), or by hand. Needs cargo; no npm
// dependency. Settings (environment):
//   TETHER_NODE_PROFILE  cargo profile: `release` (default) or `dev`, which
//                        reuses the debug dependencies a workspace build made
//   CARGO_TARGET_DIR     where cargo builds, as cargo itself reads it
'use strict';

const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const here = __dirname;
const root = path.resolve(here, '..');
const profile = process.env.TETHER_NODE_PROFILE || 'release';
// Cargo's output folder is named after the profile, but `dev` is `debug`.
const outDir = profile === 'dev' ? 'debug' : profile;
const libName = {
  linux: 'libtether_node.so',
  darwin: 'libtether_node.dylib',
  win32: 'tether_node.dll',
}[process.platform] || 'libtether_node.so';

function fail(message) {
  console.error(`tether-client: ${message}`);
  process.exit(1);
}

function cargo(args, options = {}) {
  const cargoBin = process.env.CARGO || 'cargo';
  const run = spawnSync(cargoBin, args, { cwd: root, encoding: 'utf8', ...options });
  if (run.error) {
    fail(`cannot run ${cargoBin} (${run.error.message}); install Rust to build this package`);
  }
  if (run.status !== 0) {
    fail(`\`${cargoBin} ${args.join(' ')}\` failed (exit ${run.status})${run.stderr ? `\n${run.stderr}` : ''}`);
  }
  return run.stdout;
}

if (!fs.existsSync(path.join(root, 'Cargo.toml'))) {
  fail(`${root} is not the tether workspace: build.js must stay in its node/ folder`);
}

// Cargo says where it builds, whatever sets it (CARGO_TARGET_DIR, config).
const metadata = JSON.parse(cargo(['metadata', '--format-version', '1', '--no-deps']));
const built = path.join(metadata.target_directory, outDir, libName);

console.error(`tether-client: building the native addon (cargo profile ${profile})`);
cargo(['build', '--locked', '--profile', profile, '-p', 'tether-node'], {
  stdio: ['ignore', 'inherit', 'inherit'],
});

// Copied aside, then renamed over: a process that has the old addon
// loaded keeps its mapping intact.
const dest = path.join(here, 'tether.node');
const tmp = `${dest}.${process.pid}.tmp`;
fs.copyFileSync(built, tmp);
fs.renameSync(tmp, dest);
console.error(`tether-client: built ${dest}`);
