"""Result forms the code-interpreter SDKs read, beyond IPython's own:

* `e2b/data`: a pandas DataFrame as {column: [values]} (timestamps as ISO text);
* `e2b/chart`: a matplotlib Figure as the chart data of PyPI `e2b-charts`;
* `application/json`: lists and dicts (numpy values included), as JSON;
* a PIL image saved to a file is also shown, as the official interpreter does.

Each formatter looks only at objects whose module is already imported, so a plain `1 + 1`
imports nothing.
"""

import sys

from IPython import get_ipython
from IPython.core.formatters import BaseFormatter, JSONFormatter
from traitlets import ObjectName, Unicode


class DataFrameData(BaseFormatter):
    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict, str)

    def __call__(self, obj):
        pd = sys.modules.get("pandas")
        if pd is None or not isinstance(obj, pd.DataFrame):
            return super().__call__(obj)
        columns = obj.to_dict(orient="list")
        return {k: [v.isoformat() if isinstance(v, pd.Timestamp) else v for v in vs] for k, vs in columns.items()}


class FigureChart(BaseFormatter):
    format_type = Unicode("e2b/chart")
    print_method = ObjectName("_repr_e2b_chart_")
    _return_type = (dict, str)

    def __call__(self, obj):
        if "matplotlib" not in sys.modules:
            return super().__call__(obj)
        from matplotlib.figure import Figure

        if not isinstance(obj, Figure):
            return super().__call__(obj)
        try:
            from e2b_charts import chart_figure_to_dict

            return chart_figure_to_dict(obj)
        except Exception:
            return {}


class Json(JSONFormatter):
    def __call__(self, obj):
        if isinstance(obj, (list, dict)):
            try:
                import orjson

                opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
                return orjson.loads(orjson.dumps(obj, option=opts)), {"expanded": True}
            except (TypeError, ImportError):
                pass
        return super().__call__(obj)


def _images():
    try:
        from IPython.display import display
        from PIL import Image, ImageShow
    except ImportError:
        return
    # No display here: a viewer must not try to open a window.
    ImageShow.UnixViewer.show_file = lambda self, path, **options: 0
    save = Image.Image.save

    def save_and_show(image, fp, format=None, **params):
        if isinstance(fp, str):
            display(image)
        return save(image, fp, format, **params)

    Image.Image.save = save_and_show


_ip = get_ipython()
_fmt = _ip.display_formatter
_fmt.formatters["e2b/data"] = DataFrameData(parent=_fmt)
_fmt.formatters["e2b/chart"] = FigureChart(parent=_fmt)
_fmt.formatters["application/json"] = Json(parent=_fmt)
_images()
del _ip, _fmt, _images
