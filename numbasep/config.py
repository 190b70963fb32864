"""Process-wide settings that mirror Keras's global configuration."""

from .errors import InvalidArgumentError

_VALID_FORMATS = ("channels_last", "channels_first")
_image_data_format = "channels_last"


def image_data_format():
    """Return the default ``data_format`` of the Keras-style operators.

    Returns
    -------
    str
        ``"channels_last"`` (the initial value) or ``"channels_first"``.

    Examples
    --------
    >>> import numbasep
    >>> numbasep.config.image_data_format()
    'channels_last'
    """
    return _image_data_format


def set_image_data_format(data_format):
    """Set the default ``data_format`` used when an operator gets ``data_format=None``.

    Parameters
    ----------
    data_format : {"channels_last", "channels_first"}

    Examples
    --------
    >>> import numbasep
    >>> numbasep.config.set_image_data_format("channels_first")
    >>> numbasep.config.image_data_format()
    'channels_first'
    >>> numbasep.config.set_image_data_format("channels_last")
    """
    global _image_data_format
    if not isinstance(data_format, str) or data_format.lower() not in _VALID_FORMATS:
        raise InvalidArgumentError(
            f"data_format must be one of {_VALID_FORMATS}, got {data_format!r}"
        )
    _image_data_format = data_format.lower()
