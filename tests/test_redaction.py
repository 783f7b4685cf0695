"""lazylab.redaction: a storage URL's password and secret query parameters never reach a message or a file.

Hand-worked cases (the ones the old masking got wrong among them), then properties over passwords of any
characters: the redacted URL is exactly the URL with `***` in the password's place, whatever the password holds.
"""
import shlex
import subprocess
import sys
import urllib.parse

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from lazylab.redaction import (
    MASK,
    StorageURLError,
    database_connection,
    parse_database_url,
    redact,
    redact_url,
    secrets,
)


@pytest.mark.parametrize('url, expected', [
    ('postgresql://qa:PW@127.0.0.1:5432/db', 'postgresql://qa:***@127.0.0.1:5432/db'),
    ('postgresql://qa:p@ss@h/db', 'postgresql://qa:***@h/db'),           # an @ in the password: the last one ends it
    ('postgresql://qa:S3c/ret@h/db', 'postgresql://qa:***@h/db'),        # a / in the password
    ('postgresql://qa:a:b%40c@h:1/db', 'postgresql://qa:***@h:1/db'),    # a : and a percent-encoded @
    ('postgresql://qa@h/db?password=PW', 'postgresql://qa@h/db?password=***'),
    ('mysql://u:x@h/db?sslmode=require&SSLPassword=x&api_key=k1;Token=t',
     'mysql://u:***@h/db?sslmode=require&SSLPassword=***&api_key=***;Token=***'),
    ('postgresql://h/db?passwd=a@b&pwd=c&secret=d#frag', 'postgresql://h/db?passwd=***&pwd=***&secret=***#frag'),
    ('postgresql://qa@127.0.0.1/db', 'postgresql://qa@127.0.0.1/db'),     # a user name alone is no secret
    ('sqlite:///tmp/study.db', 'sqlite:///tmp/study.db'),
    ('/shared/glu.journal', '/shared/glu.journal'),                      # a file path: nothing to hide
    ('postgresql://qa:@h/db', 'postgresql://qa:***@h/db'),
], ids=['password', 'password with @', 'password with /', 'password with : and %40', 'query password',
        'query secrets of any case', 'query secrets without userinfo', 'user only', 'sqlite', 'journal path',
        'empty password'])
def test_redact_url_hides_the_password_and_secret_parameters(url, expected):
    assert redact_url(url) == expected
    assert redact_url(expected) == expected  # idempotent


_USER = st.text(st.sampled_from('abcdefghijklmnopqrstuvwxyz0123456789_.-'), min_size=1, max_size=12)
_HOST = st.sampled_from(['127.0.0.1', 'localhost', '[::1]', 'db.local'])
_DB = st.text(st.sampled_from('abcdefghij_'), max_size=8)


@given(user=_USER, password=st.text(max_size=40), host=_HOST, port=st.integers(1, 65535), db=_DB)
def test_a_password_of_any_characters_is_replaced_whole(user, password, host, port, db):
    url = f'postgresql://{user}:{password}@{host}:{port}/{db}'
    assert redact_url(url) == f'postgresql://{user}:{MASK}@{host}:{port}/{db}'


@given(user=_USER, password=st.text(max_size=40), host=_HOST, db=_DB)
def test_a_percent_encoded_password_is_replaced_whole_and_hidden_decoded_in_a_message(user, password, host, db):
    quoted = urllib.parse.quote(password, safe='')
    url = f'postgresql://{user}:{quoted}@{host}/{db}'
    assert redact_url(url) == f'postgresql://{user}:{MASK}@{host}/{db}'
    message = f'cannot open the study storage {url}: authentication failed with password "{password}"'
    skeleton = message.replace(url, redact_url(url)).replace(f'"{password}"', '')
    assume(password not in skeleton and quoted not in skeleton)  # (else that other text is hidden too)
    out = redact(message, [url])
    assert url not in out and f'postgresql://{user}:{MASK}@{host}/{db}' in out
    if len(password) >= 4:
        assert password not in out and quoted not in out


@given(password=st.text(max_size=30), value=st.text(st.characters(blacklist_characters='&;#'), max_size=30),
       name=st.sampled_from(['password', 'PASSWORD', 'passwd', 'pwd', 'secret', 'token', 'sslpassword',
                             'api_key', 'Api-Key', 'client_secret', 'access_token']))
def test_secret_query_parameters_of_any_characters_are_replaced(password, value, name):
    url = f'postgresql://qa:{password}@127.0.0.1:5432/db?sslmode=require&{name}={value}&application_name=x'
    # a password that reads as a query, or an @ in a value (is it the password's end?): hidden further (never less)
    if any(c in password for c in '?&;') or '@' in value:
        out = redact_url(url)
        assert out.startswith('postgresql://qa:') and MASK in out
        assert (password not in out or len(password) < 4) and (value not in out or len(value) < 4)
    else:
        assert redact_url(url) == f'postgresql://qa:{MASK}@127.0.0.1:5432/db?sslmode=require&{name}={MASK}' \
                                  f'&application_name=x'


@given(password=st.text(min_size=1, max_size=30))
def test_a_command_line_redacted_argument_by_argument_holds_no_secret(password):
    url = f'postgresql://qa:{password}@127.0.0.1:5432/db'
    argv = ['transformer', 'd_model=16,32', '--storage', url, '--study', 'glu']
    # a secret of 4+ characters is hidden wherever it appears, also inside another argument (d_mo in d_model):
    # that case is the next test's
    assume(not any(secret in a for secret in secrets(url) if len(secret) >= 4 for a in argv if a != url))
    redacted = [redact(a, [url]) for a in argv]
    assert redacted == ['transformer', 'd_model=16,32', '--storage', 'postgresql://qa:***@127.0.0.1:5432/db',
                        '--study', 'glu']
    command = 'lazylab sweep ' + shlex.join(redacted)
    assert shlex.split(command)[2:] == redacted


def test_a_secret_that_also_appears_in_another_argument_is_hidden_there_too():
    url = 'postgresql://qa:d_mo@127.0.0.1:5432/db'
    assert [redact(a, [url]) for a in ['d_model=16,32', url]] == \
        [f'{MASK}del=16,32', f'postgresql://qa:{MASK}@127.0.0.1:5432/db']


def test_secrets_lists_both_forms_longest_first():
    assert secrets('postgresql://qa:a%2Fbcd@h/db?token=t%20u') == ['a%2Fbcd', 'a/bcd', 't%20u', 't u']
    assert secrets('/a/file.journal') == [] and secrets('postgresql://qa@h/db') == []


def test_a_short_secret_is_hidden_in_its_url_but_not_elsewhere():
    url = 'postgresql://qa:ab@h/db'
    assert redact(f'storage {url}: bad password for user qa (ab)', [url]) == \
        'storage postgresql://qa:***@h/db: bad password for user qa (ab)'


def test_urls_not_named_are_redacted_too():
    assert redact('tried postgresql://u:pw@h/db and mysql://v:xx@h2/db?token=zz (no luck)') == \
        'tried postgresql://u:***@h/db and mysql://v:***@h2/db?token=*** (no luck)'


def test_the_module_imports_nothing_of_lazylab_nor_torch():
    code = ('import sys; import lazylab.redaction; '
            'print(sorted(m for m in sys.modules if m.startswith(("lazylab.", "torch"))))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['lazylab.redaction']"


def test_punctuation_after_a_url_in_a_message_stays():
    url = 'postgresql://qa:pw@h/db?password=xyzw'
    message = f'cannot open the study storage {redact_url(url)}: connection refused (see {url}).'
    assert redact(message) == redact(message, [url]) == ('cannot open the study storage postgresql://qa:***@h/db?'
                                                         'password=***: connection refused (see postgresql://qa:'
                                                         '***@h/db?password=***).')


@pytest.mark.parametrize('url, parts', [
    ('postgresql://qauser:Xy@verylongsecretpart/w%40rd@127.0.0.1:55432/qadb',   # the last @ ends the password
     ('qauser', 'Xy@verylongsecretpart/w@rd', '127.0.0.1', 55432, 'qadb', (), ())),
    ('postgresql://qa@h/db?password=p%40ss%2Fx&sslmode=require',
     ('qa', None, 'h', None, 'db', (('sslmode', 'require'),), (('password', 'p@ss/x'),))),
    ('postgresql+psycopg2://u:a:b@[::1]:5432/db', ('u', 'a:b', '::1', 5432, 'db', (), ())),
    ('postgresql://h/d@b', (None, None, 'h', None, 'd@b', (), ())),    # an @ after a / and no ':': the path's
    ('sqlite:////tmp/a@b/study.db', (None, None, None, None, '/tmp/a@b/study.db', (), ())),
    ('sqlite:///study.db', (None, None, None, None, 'study.db', (), ())),
], ids=['an unencoded @ and / in the password', 'a secret query parameter', 'IPv6', 'an @ in the database',
        'an @ in a sqlite path', 'a relative sqlite path'])
def test_a_database_url_is_read_with_the_last_at_ending_the_password(url, parts):
    read = parse_database_url(url)
    assert (read.user, read.password, read.host, read.port, read.database, read.query, read.secret_query) == parts


@pytest.mark.parametrize('url, start', [
    ('postgresql://qauser@127.0.0.1:55432/qadb?password=Kq9@Zv7/Wm3', "the database URL has a '?' before its last "
                                                                      "'@', so it reads two ways"),
    ('postgresql://127.0.0.1:55432/qadb?password=Kq9@Zv7/Wm3', "the database URL has a '?' before its last '@'"),
    ('postgresql://qa:Kq9?Zv7@127.0.0.1/db', "the database URL has a '?' before its last '@'"),
    ('postgresql://qa:Kq9%C3Zv7@127.0.0.1/db', "the database URL's password is not valid percent-encoding (UTF-8)"),
    ('postgresql://Kq9:Zv7/Wm3', 'the port of the database URL is not a number'),   # no @: the password is a port
    ('postgresql://Kq9 Zv7@127.0.0.1/db?password=Wm3', None),
], ids=['an @ in a query password', 'an @ in a query password, no user', 'a ? in the password', 'not UTF-8',
        'a password without its @', 'fine'])
def test_a_database_url_that_reads_two_ways_is_refused_without_a_word_of_it(url, start):
    if start is None:
        assert parse_database_url(url).secret_query == (('password', 'Wm3'),)
        return
    with pytest.raises(StorageURLError) as e:
        parse_database_url(url)
    message = str(e.value)
    assert message.startswith(start) and '@ → %40, / → %2F' in message and '\n' not in message
    assert not any(piece in message for piece in ('Kq9', 'Zv7', 'Wm3', '127.0.0.1', '55432', 'qadb'))


@given(user=_USER, password=st.text(max_size=40), host=_HOST, port=st.integers(1, 65535), db=_DB,
       encoded=st.booleans())
def test_a_password_encoded_or_with_unencoded_at_slash_colon_reaches_the_driver_whole_and_only_there(
        user, password, host, port, db, encoded):
    if not encoded:  # a ? may start a query, and a % an escape: those two must be encoded
        assume('?' not in password and '%' not in password)
    written = urllib.parse.quote(password, safe='') if encoded else password
    url = f'postgresql://{user}:{written}@{host}:{port}/{db}?sslmode=require'
    read = parse_database_url(url)
    assert (read.user, read.password, read.host, read.port, read.database) == (user, password, host.strip('[]'),
                                                                               port, db)
    safe, connect_args = database_connection(url)
    assert safe == f'postgresql://{user}@{host}:{port}/{db}?sslmode=require' and connect_args == {'password': password}
