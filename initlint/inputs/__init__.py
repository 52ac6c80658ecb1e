"""Inputs: targets on the command line, the files they name, the user's code run safely, configuration."""
