"""The one compiled part: the Harris tokenizer's word splitting (andrea/tokenizer/_harris.c). It is optional:
where no C compiler is found, the install goes on and andrea uses the same steps written in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("andrea.tokenizer._harris", ["andrea/tokenizer/_harris.c"], optional=True,
                             extra_compile_args=["-O2"])])
