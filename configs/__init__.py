"""The YAML presets of ``adwin train --config NAME`` (installed as ``adwin.configs``; read by ``adwin.config.loading``)."""
