"""Plot placeholder."""
class PlotError(Exception):
    """Plotting is not possible."""
