"""``adwin bench gpu``: a GPU setup checked (``setup``) and measured (``command``): decode speed (``decode``),
the models it runs (``models``) and ADWIN's overhead against fixed windows (``runs``)."""
