"""worldstep.view: watching a rollout live in Rerun (docs/viewing.md).

`viewer` opens where a logged rollout goes (a native viewer, an ``.rrd`` file, the web viewer); `rerun_log`
says what one rollout looks like there. The wrappers that log an env's windows are `loggers`
(`RerunLogger`, `RerunVectorLogger`); the CLI's ``--rerun*`` flags are `worldstep.cli.view`.

This file imports nothing, so the CLI reads the viewer's ports without loading PIL or Rerun.
"""
