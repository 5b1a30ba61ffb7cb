"""WebShop: a pure-Python, gymnasium re-implementation of the WebShop shopping environment."""

from envs.webshop.env import WebShopEnv

__all__ = ["WebShopEnv"]
